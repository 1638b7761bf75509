/**
 * Ids that grow with time: UUIDv7 (RFC 9562), as the Python SDK makes them.
 *
 * The plane indexes invocation ids and call ids as it appends its audit
 * records. An id whose first bits are the time lands at the end of each
 * index; a random one (UUIDv4) lands anywhere, and as the store grows every
 * append then reads and writes back one more page per index.
 */

import { randomBytes } from "node:crypto";

/** A UUIDv7: 48 bits of Unix time in milliseconds, then the version, 74 random bits and the variant. */
export function uuid7(): string {
  const bytes = randomBytes(16);
  bytes.writeUIntBE(Date.now(), 0, 6);
  bytes.writeUInt8(0x70 | (bytes.readUInt8(6) & 0x0f), 6);
  bytes.writeUInt8(0x80 | (bytes.readUInt8(8) & 0x3f), 8);
  const hex = bytes.toString("hex");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}
