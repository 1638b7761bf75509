/** An approver's client: decide suspended calls (SPEC §7). */

import { ApprovalState } from "./gen/warden/v1/approvals_pb.js";
import { ApprovalsTransport } from "./transport.js";

/** An approval as an approver sees it. */
export interface Approval {
  readonly id: string;
  readonly capabilityId: string;
  readonly requesterId: string;
  readonly state: "pending" | "approved" | "denied" | "expired" | "consumed" | "unspecified";
  readonly message: string;
  readonly reason: string;
  readonly decidedBy: string;
}

/** The Approvals service with an approver's JWT; refusals throw `ApprovalError`. */
export class Approvals {
  private readonly transport: ApprovalsTransport;

  constructor(target: string, options: { token: string; timeoutMs?: number }) {
    this.transport = new ApprovalsTransport(target, options.token, options.timeoutMs ?? 5_000);
  }

  /** Close the connection to the plane. */
  close(): void {
    this.transport.close();
  }

  async get(id: string): Promise<Approval> {
    return approval(await this.transport.get(id));
  }

  async approve(id: string, reason = ""): Promise<Approval> {
    return approval(await this.transport.approve(id, reason));
  }

  async deny(id: string, reason: string): Promise<Approval> {
    return approval(await this.transport.deny(id, reason));
  }
}

function approval(a: Awaited<ReturnType<ApprovalsTransport["get"]>>): Approval {
  return {
    id: a?.id ?? "",
    capabilityId: a?.capabilityId ?? "",
    requesterId: a?.requesterId ?? "",
    state: (ApprovalState[a?.state ?? 0] ?? "UNSPECIFIED").toLowerCase() as Approval["state"],
    message: a?.message ?? "",
    reason: a?.reason ?? "",
    decidedBy: a?.decidedBy ?? "",
  };
}
