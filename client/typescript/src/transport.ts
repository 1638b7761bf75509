/**
 * The one place gRPC meets the SDK: clients of the generated services, and
 * the mapping from gRPC status to the SDK's errors. No `ConnectError` leaves
 * this module.
 */

import type { MessageInitShape } from "@bufbuild/protobuf";
import { type Client, Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { ApprovalError, CapabilityError, WardenError } from "./errors.js";
import { type Approval, Approvals } from "./gen/warden/v1/approvals_pb.js";
import {
  type BeginRequestSchema,
  type BeginResponse,
  type CompleteManyResponse,
  type CompleteRequest,
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
const PROCESS_METADATA = "x-warden-process";
const TRANSIENT = new Set([Code.Unavailable, Code.DeadlineExceeded, Code.Aborted]);

/**
 * Connections a runtime opens to the plane. The kernel spreads connections,
 * not calls, over a plane's processes; with eight, all of them reach one of
 * two processes once in 128 runtimes, and `choose` evens out the rest.
 */
export const CONNECTIONS = 8;
/** How fast a connection's latency fades when it is not measured again. */
export const LATENCY_DECAY_MS = 2000;
/** The least latency a connection is credited with, so that one that has not answered yet still counts the calls it carries. */
export const LATENCY_FLOOR_MS = 1;

/** One connection to the plane, and how fast it has been answering. */
export class Connection {
  /** Calls sent on this connection and not answered yet. */
  inFlight = 0;
  /** The plane's process this connection reached, once it has said (`x-warden-process`). */
  process: string | undefined;
  private latencyMs = 0;
  private latencyAt = 0;

  constructor(readonly governor: Client<typeof Governor>) {}

  /** The recent round-trip time: the peak of the last answers, fading towards zero while none comes. */
  recentLatencyMs(now: number): number {
    return this.latencyMs * Math.exp((this.latencyAt - now) / LATENCY_DECAY_MS);
  }

  /** Account for an answer that took `ms`: a slower one counts in full at once, a faster one is averaged in (a peak EWMA). */
  answered(ms: number, now: number): void {
    const weight = Math.exp((this.latencyAt - now) / LATENCY_DECAY_MS);
    const recent = this.latencyMs * weight;
    this.latencyMs = ms > recent ? ms : recent * weight + ms * (1 - weight);
    this.latencyAt = now;
  }
}

/**
 * The connection for the next call: the least recent latency times the calls
 * in flight to the same process of the plane (the peak-EWMA balancer of
 * Finagle and Linkerd, counted by process), in turn from `start` among equals.
 * A process's latency is that of its slowest connection: one left aside fades
 * towards zero and would otherwise make its busy process look fast. The same
 * rule as the Python SDK's.
 */
export function choose(connections: Connection[], start: number, now: number): Connection {
  const carried = new Map<string, number>();
  const slowest = new Map<string, number>();
  for (const c of connections) {
    if (c.process !== undefined) {
      carried.set(c.process, (carried.get(c.process) ?? 0) + c.inFlight);
      slowest.set(c.process, Math.max(slowest.get(c.process) ?? 0, c.recentLatencyMs(now)));
    }
  }
  let chosen = connections[start % connections.length] as Connection;
  let least = Number.POSITIVE_INFINITY;
  let leastOwn = 0;
  for (let step = 0; step < connections.length; step++) {
    const c = connections[(start + step) % connections.length] as Connection;
    const known = c.process !== undefined;
    const queued = known ? (carried.get(c.process as string) ?? 0) : c.inFlight;
    const latency = known ? (slowest.get(c.process as string) ?? 0) : c.recentLatencyMs(now);
    const cost = Math.max(latency, LATENCY_FLOOR_MS) * (queued + 1);
    if (cost < least || (cost === least && c.inFlight < leastOwn)) {
      chosen = c;
      least = cost;
      leastOwn = c.inFlight;
    }
  }
  return chosen;
}

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
  return refusal(statusName(e.code), e.rawMessage, target);
}

const TRANSIENT_NAMES = new Set([...TRANSIENT].map(statusName));

export const TOO_LARGE = "is larger than the plane reads";

/**
 * A Begin the plane's gRPC server would not read, for its size: the input
 * (the rest of a request is bounded), so INPUT_INVALID, which the model can
 * act on, and not GOVERNANCE_UNAVAILABLE. gRPC refused it before the plane
 * saw it: no record of it is written (docs/limits.md).
 */
function tooLarge(error: unknown): unknown {
  const cause = error instanceof CapabilityError ? error.cause : null;
  if (
    cause instanceof PlaneRefusedError &&
    cause.status === "RESOURCE_EXHAUSTED" &&
    cause.details.includes("larger than max")
  ) {
    return new CapabilityError("INPUT_INVALID", undefined, {
      details: { issues: [{ path: "", message: TOO_LARGE }] },
      cause,
    });
  }
  return error;
}

/**
 * The same for a refusal the plane named itself (`status`: a gRPC status
 * name, as in a CompleteMany result): retryable when another try could succeed.
 */
export function refusal(status: string, details: string, target: string): CapabilityError {
  return new CapabilityError("GOVERNANCE_UNAVAILABLE", undefined, {
    retryable: TRANSIENT_NAMES.has(status),
    cause: new PlaneRefusedError(status, details, target),
  });
}

/**
 * A gRPC transport to the plane with its HTTP/2 session in hand, so that it
 * can be closed: connect-node would keep an idle one open for 15 minutes.
 */
function closableTransport(target: string) {
  const sessions = new Http2SessionManager(baseUrl(target));
  return {
    sessions,
    transport: createGrpcTransport({ baseUrl: baseUrl(target), sessionManager: sessions }),
  };
}

/** Access to the plane for a service, with its token. */
export class Transport {
  private readonly sessions: Http2SessionManager[];
  private readonly connections: Connection[];
  private turn = 0;
  private readonly registry: Client<typeof Registry>;
  private readonly grantKeysClient: Client<typeof GrantKeys>;
  private readonly headers: Record<string, string>;

  constructor(
    readonly target: string,
    token: string,
    private readonly timeoutMs: number,
  ) {
    const opened = Array.from({ length: CONNECTIONS }, () => closableTransport(target));
    this.sessions = opened.map((o) => o.sessions);
    const transports = opened.map((o) => o.transport);
    this.connections = transports.map((t) => new Connection(createClient(Governor, t)));
    const [first] = transports;
    this.registry = createClient(Registry, first as (typeof transports)[number]);
    this.grantKeysClient = createClient(GrantKeys, first as (typeof transports)[number]);
    this.headers = { [SERVICE_TOKEN_METADATA]: token };
  }

  private closed: AbortSignal | undefined;

  private options() {
    return { headers: this.headers, timeoutMs: this.timeoutMs, signal: this.closed };
  }

  /**
   * Close every connection; a call made after fails closed
   * (GOVERNANCE_UNAVAILABLE), and opens none.
   */
  close(): void {
    this.closed = AbortSignal.abort(new Error("the runtime is closed"));
    for (const session of this.sessions) session.abort();
  }

  /** A Governor call on the connection `choose` picks, timed, and told which process answered. */
  private async governed<T>(
    call: (
      governor: Client<typeof Governor>,
      options: ReturnType<Transport["options"]> & { onTrailer: (trailers: Headers) => void },
    ) => Promise<T>,
  ): Promise<T> {
    const connection = choose(this.connections, this.turn++, performance.now());
    connection.inFlight++;
    const sent = performance.now();
    const onTrailer = (trailers: Headers) => {
      const process = trailers.get(PROCESS_METADATA);
      if (process) connection.process = process;
    };
    try {
      return await call(connection.governor, { ...this.options(), onTrailer });
    } catch (error) {
      throw governanceError(error, this.target);
    } finally {
      connection.inFlight--;
      const now = performance.now();
      connection.answered(now - sent, now);
    }
  }

  /** Begin; throws CapabilityError(GOVERNANCE_UNAVAILABLE) when the plane cannot answer. */
  async begin(request: MessageInitShape<typeof BeginRequestSchema>): Promise<BeginResponse> {
    try {
      return await this.governed((governor, options) => governor.begin(request, options));
    } catch (error) {
      throw tooLarge(error);
    }
  }

  /** Complete; throws CapabilityError(GOVERNANCE_UNAVAILABLE) when the plane cannot answer. */
  async complete(request: MessageInitShape<typeof CompleteRequestSchema>): Promise<void> {
    await this.governed((governor, options) => governor.complete(request, options));
  }

  /** CompleteMany: each report is taken or refused on its own (`results`, in order). */
  async completeMany(requests: CompleteRequest[]): Promise<CompleteManyResponse> {
    const reports = requests.map((request) => ({ request }));
    return this.governed((governor, options) => governor.completeMany({ reports }, options));
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
      const response = await this.grantKeysClient.listGrantKeys(
        {},
        { timeoutMs: this.timeoutMs, signal: this.closed },
      );
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
  private readonly sessions: Http2SessionManager;
  private readonly headers: Record<string, string>;

  constructor(
    readonly target: string,
    token: string,
    private readonly timeoutMs: number,
  ) {
    const { sessions, transport } = closableTransport(target);
    this.sessions = sessions;
    this.client = createClient(Approvals, transport);
    this.headers = { [ACTOR_TOKEN_METADATA]: `Bearer ${token}` };
  }

  /** Close the connection. */
  close(): void {
    this.sessions.abort();
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
