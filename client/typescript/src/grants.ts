/**
 * Verifying grants without calling the plane.
 *
 * A grant is an Ed25519-signed JWT (`alg: EdDSA`, with a `kid`) bound to one
 * invocation: capability id and version, actor, service and the RFC 8785
 * digest of the input (`docs/grants.md`). A handler passes `ctx.grantToken`
 * downstream; the downstream service checks it with the plane's published
 * keys (`Runtime.grantKeys()`, the `GrantKeys.ListGrantKeys` RPC).
 */

import { createPublicKey, type KeyObject, verify } from "node:crypto";
import { digest } from "./canonical.js";

export const GRANT_ISSUER = "warden";
export const GRANT_ALGORITHM = "EdDSA";

/** A public key that signs grants, as the plane publishes it. */
export interface GrantKey {
  readonly keyId: string;
  readonly publicKeyPem: string;
  /** Whether the plane signs new grants with it (others are kept for rotation). */
  readonly signing?: boolean;
}

/** What a grant permits. */
export interface GrantClaims {
  readonly invocationId: string;
  readonly capabilityId: string;
  readonly capabilityVersion: string;
  readonly service: string;
  readonly actorId: string;
  readonly inputDigest: string;
  /** Seconds since the epoch. */
  readonly expiresAt: number;
}

/** Why a grant was refused: the classes the conformance vectors name. */
export type GrantRefusal =
  | "malformed"
  | "unknown-key"
  | "rejected"
  | "expired"
  | "wrong-capability"
  | "wrong-input";

/** A grant does not authorize what it was presented for; `reason` says why. */
export class GrantVerificationError extends Error {
  override readonly name = "GrantVerificationError";
  readonly reason: GrantRefusal;

  constructor(reason: GrantRefusal, message: string) {
    super(message);
    this.reason = reason;
  }
}

export interface VerifyGrantOptions {
  /** The capability the grant must be for. */
  capabilityId: string;
  /** The arguments the grant must be for (their digest is compared)... */
  input?: unknown;
  /** ...or their digest, `sha256:<hex>`. */
  inputDigest?: string;
  /** Seconds since the epoch to check expiry at; now by default. */
  now?: number;
  /** Clock skew tolerated on expiry, in seconds. */
  leewayS?: number;
}

const REQUIRED = ["iss", "jti", "sub", "cap", "ver", "svc", "dig", "exp"] as const;

/**
 * Check that `token` authorizes running `capabilityId` on this input.
 *
 * @param keys The plane's keys, or a mapping from key id to PEM public key.
 * @throws GrantVerificationError forged, signed by a key not in `keys`,
 *   expired, or for another capability or input.
 * @throws TypeError neither or both of `input` and `inputDigest` given.
 */
export function verifyGrant(
  token: string,
  keys: Iterable<GrantKey> | ReadonlyMap<string, string> | Readonly<Record<string, string>>,
  options: VerifyGrantOptions,
): GrantClaims {
  if ((options.input === undefined) === (options.inputDigest === undefined)) {
    throw new TypeError("give exactly one of input and inputDigest");
  }
  const expected = options.inputDigest ?? digest(options.input);
  const parts = token.split(".");
  const header = parts.length === 3 ? decodeSegment(parts[0] ?? "") : null;
  const payload = parts.length === 3 ? decodeSegment(parts[1] ?? "") : null;
  // No signature at all (alg none) is refused as such below.
  const signature =
    parts.length !== 3 ? null : parts[2] === "" ? Buffer.alloc(0) : segmentBytes(parts[2] ?? "");
  if (header === null || payload === null || signature === null) {
    throw new GrantVerificationError("malformed", "not a grant token: not a well-formed JWT");
  }
  const kid = header.kid;
  const key = typeof kid === "string" ? publicKeys(keys).get(kid) : undefined;
  if (key === undefined) {
    throw new GrantVerificationError("unknown-key", `signed by an unknown key (kid ${kid})`);
  }
  if (header.alg !== GRANT_ALGORITHM) {
    throw new GrantVerificationError("rejected", "grant rejected: the algorithm is not EdDSA");
  }
  const signed = Buffer.from(`${parts[0]}.${parts[1]}`);
  if (!verify(null, signed, key, signature)) {
    throw new GrantVerificationError("rejected", "grant rejected: bad signature");
  }
  for (const claim of REQUIRED) {
    if (!(claim in payload)) {
      throw new GrantVerificationError("rejected", `grant rejected: no ${claim} claim`);
    }
  }
  if (payload.iss !== GRANT_ISSUER) {
    throw new GrantVerificationError("rejected", "grant rejected: another issuer");
  }
  if (!Number.isInteger(payload.exp)) {
    throw new GrantVerificationError("rejected", "grant rejected: exp is not an integer");
  }
  const exp = payload.exp as number;
  const now = options.now ?? Date.now() / 1000;
  if (now >= exp + (options.leewayS ?? 0)) {
    throw new GrantVerificationError("expired", "grant expired");
  }
  const claims: GrantClaims = {
    invocationId: String(payload.jti),
    capabilityId: String(payload.cap),
    capabilityVersion: String(payload.ver),
    service: String(payload.svc),
    actorId: String(payload.sub),
    inputDigest: String(payload.dig),
    expiresAt: exp,
  };
  if (claims.capabilityId !== options.capabilityId) {
    throw new GrantVerificationError(
      "wrong-capability",
      `the grant is for ${claims.capabilityId}, not ${options.capabilityId}`,
    );
  }
  if (claims.inputDigest !== expected) {
    throw new GrantVerificationError("wrong-input", "the grant is for another input");
  }
  return claims;
}

/**
 * A segment's bytes, when it is base64url as the plane writes it: nothing but
 * the alphabet, no padding, and no bits past the last byte. Buffer.from skips
 * what it cannot decode, so without this many texts would be one grant.
 */
function segmentBytes(segment: string): Buffer | null {
  if (!/^[A-Za-z0-9_-]+$/.test(segment)) return null;
  const bytes = Buffer.from(segment, "base64url");
  return bytes.toString("base64url") === segment ? bytes : null;
}

function decodeSegment(segment: string): Record<string, unknown> | null {
  const bytes = segmentBytes(segment);
  if (bytes === null) return null;
  try {
    const value: unknown = JSON.parse(bytes.toString("utf8"));
    return value !== null && typeof value === "object" && !Array.isArray(value)
      ? (value as Record<string, unknown>)
      : null;
  } catch {
    return null;
  }
}

function publicKeys(
  keys: Iterable<GrantKey> | ReadonlyMap<string, string> | Readonly<Record<string, string>>,
): Map<string, KeyObject> {
  // A Map is iterable too, of [key id, PEM] pairs: told apart first.
  const pairs: [string, string][] =
    keys instanceof Map
      ? [...(keys as ReadonlyMap<string, string>).entries()]
      : Symbol.iterator in keys
        ? [...(keys as Iterable<GrantKey>)].map((k) => [k.keyId, k.publicKeyPem])
        : Object.entries(keys as Record<string, string>);
  const out = new Map<string, KeyObject>();
  for (const [kid, pem] of pairs) {
    const key = createPublicKey(pem);
    if (key.asymmetricKeyType !== "ed25519") throw new TypeError(`key ${kid} is not Ed25519`);
    out.set(kid, key);
  }
  return out;
}
