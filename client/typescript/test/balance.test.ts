/**
 * Which connection a call takes: where it is expected to be answered soonest
 * (recent latency times calls in flight to the same process), in turn among
 * equals. The kernel hands a service's connections to a plane's processes
 * unevenly; dealt out in turn, calls would queue at the busiest process.
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import { CONNECTIONS, Connection, choose, LATENCY_DECAY_MS } from "../src/transport.js";

function connections(): Connection[] {
  return Array.from({ length: CONNECTIONS }, () => new Connection({} as never));
}

test("connections nothing is known of are taken in turn", () => {
  const all = connections();
  const chosen = Array.from({ length: 3 * CONNECTIONS }, (_, turn) => choose(all, turn, 0));
  for (const c of all) assert.equal(chosen.filter((x) => x === c).length, 3);
});

test("a call goes where answers come back soonest", () => {
  const [fast, ...others] = connections() as [Connection, ...Connection[]];
  for (const c of others) {
    c.answered(800, 10_000);
    c.inFlight = 100;
  }
  fast.answered(40, 10_000);
  fast.inFlight = 100;
  for (let turn = 0; turn < 8; turn++) assert.equal(choose([fast, ...others], turn, 10_000), fast);
});

test("connections to one process count its calls together", () => {
  const all = connections();
  const lone = all[all.length - 1] as Connection;
  all.forEach((c, i) => {
    c.process = c === lone ? "b" : "a";
    c.inFlight = c === lone ? 10 : i < 3 ? 10 : 0;
    c.answered(100, 10_000);
  });
  for (let turn = 0; turn < 8; turn++) assert.equal(choose(all, turn, 10_000), lone);
  lone.inFlight = 31;
  for (let turn = 0; turn < 8; turn++) assert.notEqual(choose(all, turn, 10_000), lone);
});

test("a connection left aside is tried again as its latency fades", () => {
  const [slow, ...others] = connections() as [Connection, ...Connection[]];
  slow.answered(2000, 10_000);
  for (const c of others) {
    c.answered(50, 10_000);
    c.inFlight = 3;
  }
  assert.notEqual(choose([slow, ...others], 0, 10_000), slow);
  const later = 10_000 + 12 * LATENCY_DECAY_MS;
  for (const c of others) c.answered(50, later);
  assert.equal(choose([slow, ...others], 0, later), slow);
});

test("a connection that never answers does not draw every call", () => {
  const [silent, ...others] = connections() as [Connection, ...Connection[]];
  silent.inFlight = 50;
  for (const c of others) c.answered(2, 10_000);
  for (let turn = 0; turn < 8; turn++)
    assert.notEqual(choose([silent, ...others], turn, 10_000), silent);
});

test("a connection left aside does not make its busy process look fast", () => {
  const all = connections();
  const [leftAside, fastA, fastB] = all.slice(-3) as [Connection, Connection, Connection];
  for (const c of all.slice(0, -3)) {
    c.process = "slow";
    c.inFlight = 60;
    c.answered(1000, 10_000);
  }
  leftAside.process = "slow";
  leftAside.answered(1000, 0);
  for (const c of [fastA, fastB]) {
    c.process = "fast";
    c.inFlight = 50;
    c.answered(300, 10_000);
  }
  assert.ok(leftAside.recentLatencyMs(10_000) < 10);
  for (let turn = 0; turn < 8; turn++) {
    assert.ok([fastA, fastB].includes(choose(all, turn, 10_000)));
  }
});
