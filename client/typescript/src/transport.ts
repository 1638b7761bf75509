/**
 * The one place gRPC meets the SDK: clients of the generated services, and
 * the mapping from gRPC status to the SDK's errors. No `ConnectError` leaves
 * this module.
 */

import type { MessageInitShape } from "@bufbuild/protobuf";
import { type Client, Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { ApprovalError, CapabilityError, WardenError } from "./errors.js";
import { type Approval, Approvals } from "./gen/warden/v1/approvals_pb.js";
import {
  type BeginRequestSchema,
  type BeginResponse,
  type CompleteRequestSchema,
  Governor,
} from "./gen/warden/v1/governor_pb.js";
import { GrantKeys } from "./gen/warden/v1/grants_pb.js";
import {
  type Capability,
  type CapabilityDefinition,
  Registry,
} from "./gen/warden/v1/registry_pb.js";
import type { GrantKey } from "./grants.js";

const SERVICE_TOKEN_METADATA = "x-warden-service-token";
const ACTOR_TOKEN_METADATA = "authorization";
const TRANSIENT = new Set([Code.Unavailable, Code.DeadlineExceeded, Code.Aborted]);

/** gRPC status names, as the plane's messages and the Python SDK spell them. */
function statusName(code: Code): string {
  return Code[code].replace(/([a-z])([A-Z])/g, "$1_$2").toUpperCase();
}

/** The plane answered a governed call with a gRPC error (kept as a cause). */
export class PlaneRefusedError extends Error {
  override readonly name = "PlaneRefusedError";
  constructor(
    readonly status: string,
    readonly details: string,
    target: string,
  ) {
    super(`${target} answered ${status}: ${details}`);
  }
}

function baseUrl(target: string): string {
  return /^https?:\/\//.test(target) ? target : `http://${target}`;
}

function asConnectError(error: unknown): ConnectError {
  return ConnectError.from(error);
}

/**
 * The SDK's one mapping from a gRPC status to a model-facing error: every
 * status fails closed as GOVERNANCE_UNAVAILABLE, retryable only when another
 * attempt could succeed (the plane down or slow).
 */
export function governanceError(error: unknown, target: string): CapabilityError {
  const e = asConnectError(error);
  return new CapabilityError("GOVERNANCE_UNAVAILABLE", undefined, {
    retryable: TRANSIENT.has(e.code),
    cause: new PlaneRefusedError(statusName(e.code), e.rawMessage, target),
  });
}

/** Access to the plane for a service, with its token. */
export class Transport {
  private readonly governor: Client<typeof Governor>;
  private readonly registry: Client<typeof Registry>;
  private readonly grantKeysClient: Client<typeof GrantKeys>;
  private readonly headers: Record<string, string>;

  constructor(
    readonly target: string,
    token: string,
    private readonly timeoutMs: number,
  ) {
    const transport = createGrpcTransport({ baseUrl: baseUrl(target) });
    this.governor = createClient(Governor, transport);
    this.registry = createClient(Registry, transport);
    this.grantKeysClient = createClient(GrantKeys, transport);
    this.headers = { [SERVICE_TOKEN_METADATA]: token };
  }

  private options() {
    return { headers: this.headers, timeoutMs: this.timeoutMs };
  }

  /** Begin; throws CapabilityError(GOVERNANCE_UNAVAILABLE) when the plane cannot answer. */
  async begin(request: MessageInitShape<typeof BeginRequestSchema>): Promise<BeginResponse> {
    try {
      return await this.governor.begin(request, this.options());
    } catch (error) {
      throw governanceError(error, this.target);
    }
  }

  /** Complete; throws CapabilityError(GOVERNANCE_UNAVAILABLE) when the plane cannot answer. */
  async complete(request: MessageInitShape<typeof CompleteRequestSchema>): Promise<void> {
    try {
      await this.governor.complete(request, this.options());
    } catch (error) {
      throw governanceError(error, this.target);
    }
  }

  /** Register; throws WardenError with the plane's message when refused. */
  async register(definitions: CapabilityDefinition[]): Promise<Capability[]> {
    try {
      const response = await this.registry.register({ capabilities: definitions }, this.options());
      return response.capabilities;
    } catch (error) {
      const e = asConnectError(error);
      throw new WardenError(
        `registration with ${this.target} failed (${statusName(e.code)}): ${e.rawMessage}`,
        { transient: TRANSIENT.has(e.code) },
      );
    }
  }

  /** Discovery for an actor: UNAUTHENTICATED when the plane refused the actor. */
  async listCapabilities(
    actorToken: string,
    surface: string,
    contextJson: string,
  ): Promise<Capability[]> {
    try {
      const response = await this.registry.listCapabilities(
        { actorToken, surface, contextJson },
        this.options(),
      );
      return response.capabilities;
    } catch (error) {
      const e = asConnectError(error);
      if (e.code === Code.Unauthenticated) {
        throw new CapabilityError("UNAUTHENTICATED", undefined, {
          cause: new PlaneRefusedError(statusName(e.code), e.rawMessage, this.target),
        });
      }
      throw governanceError(error, this.target);
    }
  }

  /** The plane's published grant keys; throws WardenError when it cannot be asked. */
  async grantKeys(): Promise<GrantKey[]> {
    try {
      const response = await this.grantKeysClient.listGrantKeys({}, { timeoutMs: this.timeoutMs });
      return response.keys.map((k) => ({
        keyId: k.keyId,
        publicKeyPem: k.publicKeyPem,
        signing: k.signing,
      }));
    } catch (error) {
      const e = asConnectError(error);
      throw new WardenError(
        `listing grant keys at ${this.target} failed (${statusName(e.code)}): ${e.rawMessage}`,
        { transient: TRANSIENT.has(e.code) },
      );
    }
  }
}

/** Access to the Approvals service with an approver's JWT. */
export class ApprovalsTransport {
  private readonly client: Client<typeof Approvals>;
  private readonly headers: Record<string, string>;

  constructor(
    readonly target: string,
    token: string,
    private readonly timeoutMs: number,
  ) {
    this.client = createClient(Approvals, createGrpcTransport({ baseUrl: baseUrl(target) }));
    this.headers = { [ACTOR_TOKEN_METADATA]: `Bearer ${token}` };
  }

  private async call<T>(run: () => Promise<T>): Promise<T> {
    try {
      return await run();
    } catch (error) {
      const e = asConnectError(error);
      throw new ApprovalError(statusName(e.code), e.rawMessage, {
        transient: TRANSIENT.has(e.code),
      });
    }
  }

  async get(id: string): Promise<Approval | undefined> {
    const options = { headers: this.headers, timeoutMs: this.timeoutMs };
    const response = await this.call(() => this.client.getApproval({ id }, options));
    return response.approval;
  }

  async approve(id: string, reason: string): Promise<Approval | undefined> {
    const options = { headers: this.headers, timeoutMs: this.timeoutMs };
    const response = await this.call(() => this.client.approve({ id, reason }, options));
    return response.approval;
  }

  async deny(id: string, reason: string): Promise<Approval | undefined> {
    const options = { headers: this.headers, timeoutMs: this.timeoutMs };
    const response = await this.call(() => this.client.deny({ id, reason }, options));
    return response.approval;
  }
}
