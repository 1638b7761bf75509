/** Invocation and call ids are UUIDv7: appended at the end of the plane's indexes, not at random places. */

import assert from "node:assert/strict";
import { test } from "node:test";
import { uuid7 } from "../src/ids.js";

const UUID7 = /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

test("ids are UUIDv7 whose first 48 bits are the time in milliseconds", () => {
  const before = Date.now();
  const id = uuid7();
  const after = Date.now();
  assert.match(id, UUID7);
  const stamp = Number.parseInt(id.replaceAll("-", "").slice(0, 12), 16);
  assert.ok(before <= stamp && stamp <= after, `${stamp} is not between ${before} and ${after}`);
});

test("ids made later sort after earlier ones, and never repeat", async () => {
  const first = uuid7();
  await new Promise((resolve) => setTimeout(resolve, 3));
  const later = Array.from({ length: 1000 }, () => uuid7());
  assert.equal(new Set(later).size, later.length);
  for (const id of later) {
    assert.match(id, UUID7);
    assert.ok(first < id, `${id} sorts before ${first}`);
  }
});
