/**
 * Outcome reports: those that come due in one turn of the event loop go
 * together at its end; those that come due while the report calls are busy go
 * together in the next; each is answered on its own; a plane without
 * CompleteMany gets them one by one.
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import { create } from "@bufbuild/protobuf";
import { CapabilityError } from "../src/errors.js";
import {
  type CompleteManyResponse,
  CompleteManyResponseSchema,
  type CompleteRequest,
} from "../src/gen/warden/v1/governor_pb.js";
import {
  BYTES_PER_CALL,
  REPORT_CALLS_IN_FLIGHT,
  REPORTS_PER_CALL,
  type ReportSender,
  Reports,
} from "../src/reports.js";
import { PlaneRefusedError } from "../src/transport.js";

/** A plane stand-in that holds each call until the test lets it answer. */
class HeldPlane implements ReportSender {
  readonly target = "plane.test:443";
  readonly calls: { method: "Complete" | "CompleteMany"; ids: string[] }[] = [];
  private readonly held: (() => void)[] = [];
  knowsMany = true;
  refuse = new Map<string, string>();

  complete(request: CompleteRequest): Promise<void> {
    this.calls.push({ method: "Complete", ids: [request.invocationId] });
    return this.hold(() => undefined);
  }

  completeMany(requests: CompleteRequest[]): Promise<CompleteManyResponse> {
    this.calls.push({ method: "CompleteMany", ids: requests.map((r) => r.invocationId) });
    if (!this.knowsMany) return Promise.reject(planeError("UNIMPLEMENTED", false));
    return this.hold(() =>
      create(CompleteManyResponseSchema, {
        results: requests.map((r) => {
          const code = this.refuse.get(r.invocationId);
          return code
            ? { result: { case: "refusal" as const, value: { code, message: "no" } } }
            : { result: { case: "auditSeq" as const, value: 1n } };
        }),
      }),
    );
  }

  /** Answer every call held so far. */
  answerAll(): void {
    for (const answer of this.held.splice(0)) answer();
  }

  private hold<T>(answer: () => T): Promise<T> {
    return new Promise((resolve) => this.held.push(() => resolve(answer())));
  }
}

function planeError(status: string, retryable: boolean): CapabilityError {
  return new CapabilityError("GOVERNANCE_UNAVAILABLE", undefined, {
    retryable,
    cause: new PlaneRefusedError(status, "said the plane", "plane.test:443"),
  });
}

const report = (id: string, outputJson = "{}") => ({ invocationId: id, outputJson });
const settle = () => new Promise((resolve) => setImmediate(resolve));

/** Fill every report call, each with a report of its own turn; their promises. */
async function busy(reports: Reports): Promise<Promise<void>[]> {
  const sent = [];
  for (let i = 0; i < REPORT_CALLS_IN_FLIGHT; i++) {
    sent.push(reports.send(report(`busy${i}`)));
    await settle();
  }
  return sent;
}

test("a report made alone is sent at the end of the loop's turn", async () => {
  const plane = new HeldPlane();
  const reports = new Reports(plane);
  const sent = reports.send(report("a"));
  assert.deepEqual(plane.calls, []);
  await settle();
  assert.deepEqual(plane.calls, [{ method: "CompleteMany", ids: ["a"] }]);
  plane.answerAll();
  await sent;
});

test("the reports of one turn go together", async () => {
  const plane = new HeldPlane();
  const reports = new Reports(plane);
  const sent = ["a", "b", "c"].map((id) => reports.send(report(id)));
  await settle();
  assert.deepEqual(plane.calls, [{ method: "CompleteMany", ids: ["a", "b", "c"] }]);
  plane.answerAll();
  await Promise.all(sent);
});

test("reports due while the report calls are busy go together in the next call", async () => {
  const plane = new HeldPlane();
  const reports = new Reports(plane);
  const busyOnes = await busy(reports);
  assert.equal(plane.calls.length, REPORT_CALLS_IN_FLIGHT);
  const ids = Array.from({ length: 40 }, (_, i) => `r${i}`);
  const sent = ids.map((id) => reports.send(report(id)));
  await settle();
  assert.equal(plane.calls.length, REPORT_CALLS_IN_FLIGHT);
  plane.answerAll();
  await settle();
  assert.equal(plane.calls.length, REPORT_CALLS_IN_FLIGHT + 1);
  assert.deepEqual(plane.calls.at(-1)?.ids, ids);
  plane.answerAll();
  await Promise.all([...busyOnes, ...sent]);
});

test("a call holds at most its count and its bytes of reports", async () => {
  const plane = new HeldPlane();
  const reports = new Reports(plane);
  const busyOnes = await busy(reports);
  const many = Array.from({ length: REPORTS_PER_CALL + 1 }, (_, i) =>
    reports.send(report(`n${i}`)),
  );
  const big = "x".repeat(BYTES_PER_CALL / 2);
  const large = [0, 1, 2].map((i) => reports.send(report(`l${i}`, JSON.stringify(big))));
  plane.answerAll();
  await settle();
  const sizes = plane.calls.slice(REPORT_CALLS_IN_FLIGHT).map((c) => c.ids.length);
  // 256 reports; then the 257th with the first large one; then one large each.
  assert.deepEqual(sizes, [REPORTS_PER_CALL, 2, 1, 1]);
  plane.answerAll();
  await settle();
  plane.answerAll();
  await Promise.all([...busyOnes, ...many, ...large]);
});

test("each report is answered on its own", async () => {
  const plane = new HeldPlane();
  plane.refuse.set("gone", "NOT_FOUND").set("later", "UNAVAILABLE");
  const reports = new Reports(plane);
  const busyOnes = await busy(reports);
  const taken = reports.send(report("ok"));
  const gone = reports.send(report("gone"));
  const later = reports.send(report("later"));
  plane.answerAll();
  await settle();
  plane.answerAll();
  await Promise.all(busyOnes);
  await taken;
  await assert.rejects(gone, (error: CapabilityError) => {
    assert.equal(error.code, "GOVERNANCE_UNAVAILABLE");
    assert.equal(error.retryable, false);
    assert.equal((error.cause as PlaneRefusedError).status, "NOT_FOUND");
    return true;
  });
  await assert.rejects(later, (error: CapabilityError) => error.retryable);
});

test("a failed call fails each of its reports with the call's error", async () => {
  const failing: ReportSender = {
    target: "plane.test:443",
    complete: () => Promise.reject(planeError("UNAVAILABLE", true)),
    completeMany: () => Promise.reject(planeError("UNAVAILABLE", true)),
  };
  const reports = new Reports(failing);
  const results = await Promise.allSettled([reports.send(report("a")), reports.send(report("b"))]);
  for (const result of results) {
    assert.equal(result.status, "rejected");
    assert.equal((result.reason as CapabilityError).retryable, true);
  }
});

test("a plane without CompleteMany gets the reports one by one through Complete", async () => {
  const plane = new HeldPlane();
  plane.knowsMany = false;
  const reports = new Reports(plane);
  const first = reports.send(report("a"));
  await settle();
  assert.deepEqual(plane.calls, [
    { method: "CompleteMany", ids: ["a"] },
    { method: "Complete", ids: ["a"] },
  ]);
  plane.answerAll();
  await first;
  const more = [reports.send(report("b")), reports.send(report("c"))];
  await settle();
  plane.answerAll();
  await settle();
  plane.answerAll();
  await Promise.all(more);
  assert.deepEqual(
    plane.calls.slice(2).map((c) => `${c.method} ${c.ids.join(",")}`),
    ["Complete b", "Complete c"],
  );
});
