/**
 * Outcome reports, sent together when several come due at once.
 *
 * A report goes at the end of the event loop's turn in which it came due,
 * with every other report of that turn, while fewer than
 * `REPORT_CALLS_IN_FLIGHT` report calls are in flight; the reports that come
 * due while they are wait, and go together in the next call. A call
 * (`CompleteMany`) holds up to `REPORTS_PER_CALL` reports or `BYTES_PER_CALL`
 * bytes, and the plane commits its reports in one transaction. A call made
 * alone is reported as soon as before; under load a
 * governed call costs the plane one `Begin` and a share of one report call,
 * not two calls and two commits. A plane that does not know `CompleteMany`
 * (one older than the SDK) gets the reports one by one through `Complete`.
 *
 * Each report is answered on its own: the plane may take some of a call's
 * reports and refuse others, and the call as a whole may fail.
 */

import { create, type MessageInitShape, toBinary } from "@bufbuild/protobuf";
import { CapabilityError } from "./errors.js";
import {
  type CompleteManyResponse,
  type CompleteRequest,
  CompleteRequestSchema,
} from "./gen/warden/v1/governor_pb.js";
import { PlaneRefusedError, refusal } from "./transport.js";

/** Report calls in flight at once; the reports that come due meanwhile wait for the next. */
export const REPORT_CALLS_IN_FLIGHT = 4;
/** The most reports in one `CompleteMany` call (the plane takes 256). */
export const REPORTS_PER_CALL = 256;
/** The most bytes of reports in one call, well under gRPC's 4 MiB message limit. */
export const BYTES_PER_CALL = 512 * 1024;

/** What sends reports: `Transport`, or a test's stand-in. */
export interface ReportSender {
  readonly target: string;
  complete(request: CompleteRequest): Promise<void>;
  completeMany(requests: CompleteRequest[]): Promise<CompleteManyResponse>;
}

interface Due {
  request: CompleteRequest;
  size: number;
  taken: () => void;
  failed: (error: CapabilityError) => void;
}

/** The reports of one runtime on their way to the plane. */
export class Reports {
  private readonly due: Due[] = [];
  private calls = 0;
  private pumping = false;
  /** False once the plane answered that it does not know `CompleteMany`. */
  private many = true;

  constructor(private readonly sender: ReportSender) {}

  /**
   * Send one report. Resolves once the plane has taken it; rejects with a
   * CapabilityError (GOVERNANCE_UNAVAILABLE, retryable when another try could
   * succeed) when the call failed or the plane refused this report.
   */
  send(request: MessageInitShape<typeof CompleteRequestSchema>): Promise<void> {
    const message = create(CompleteRequestSchema, request);
    return new Promise((taken, failed) => {
      const size = toBinary(CompleteRequestSchema, message).length;
      this.due.push({ request: message, size, taken, failed });
      if (!this.pumping) {
        this.pumping = true;
        setImmediate(() => {
          this.pumping = false;
          this.pump();
        });
      }
    });
  }

  private pump(): void {
    while (this.due.length > 0 && this.calls < REPORT_CALLS_IN_FLIGHT) {
      const batch = this.next();
      this.calls++;
      void this.deliver(batch).finally(() => {
        this.calls--;
        this.pump();
      });
    }
  }

  /** The reports for the next call: in the order they came, within its bounds. */
  private next(): Due[] {
    if (!this.many) return this.due.splice(0, 1);
    let count = 0;
    let bytes = 0;
    for (const report of this.due) {
      if (count === REPORTS_PER_CALL || (count > 0 && bytes + report.size > BYTES_PER_CALL)) break;
      count++;
      bytes += report.size;
    }
    return this.due.splice(0, count);
  }

  private async deliver(batch: Due[]): Promise<void> {
    if (!this.many) {
      await this.deliverAlone(batch);
      return;
    }
    let response: CompleteManyResponse;
    try {
      response = await this.sender.completeMany(batch.map((report) => report.request));
    } catch (thrown) {
      const cause = thrown instanceof CapabilityError ? thrown.cause : undefined;
      if (cause instanceof PlaneRefusedError && cause.status === "UNIMPLEMENTED") {
        this.many = false;
        await this.deliverAlone(batch);
        return;
      }
      for (const report of batch) report.failed(asGovernanceError(thrown));
      return;
    }
    if (response.results.length !== batch.length) {
      const said = `answered ${response.results.length} results for ${batch.length} reports`;
      const error = refusal("UNKNOWN", said, this.sender.target);
      for (const report of batch) report.failed(error);
      return;
    }
    batch.forEach((report, i) => {
      const result = response.results[i]?.result;
      if (result?.case === "refusal") {
        report.failed(refusal(result.value.code, result.value.message, this.sender.target));
      } else {
        report.taken();
      }
    });
  }

  private async deliverAlone(batch: Due[]): Promise<void> {
    for (const report of batch) {
      try {
        await this.sender.complete(report.request);
        report.taken();
      } catch (thrown) {
        report.failed(asGovernanceError(thrown));
      }
    }
  }
}

function asGovernanceError(thrown: unknown): CapabilityError {
  return thrown instanceof CapabilityError
    ? thrown
    : new CapabilityError("GOVERNANCE_UNAVAILABLE", undefined, { cause: thrown });
}
