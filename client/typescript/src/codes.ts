/**
 * The error-code and stage table, read from the protobuf contract.
 *
 * `proto/warden/v1/errors.proto` is the single source of truth: each enum
 * value carries its defaults as custom options, read here once at import,
 * exactly as the Python SDK reads them.
 */

import { getOption } from "@bufbuild/protobuf";
import {
  default_stage,
  ErrorCodeSchema,
  exposed,
  meaning,
  public_message,
  retryable,
  StageSchema,
  stage_name,
} from "./gen/warden/v1/errors_pb.js";

/** The defaults of one built-in error code. */
export interface CodeDefaults {
  readonly code: string;
  readonly stage: string;
  readonly exposed: boolean;
  readonly retryable: boolean;
  readonly publicMessage: string;
  readonly meaning: string;
}

const CODE_PREFIX = "ERROR_CODE_";

const stageNames = new Map<number, string>();
for (const value of StageSchema.values) {
  if (value.number !== 0) stageNames.set(value.number, getOption(value, stage_name));
}

/** Every stage's contract string, in pipeline order. */
export const STAGES: readonly string[] = [...stageNames.values()];

const codes = new Map<string, CodeDefaults>();
for (const value of ErrorCodeSchema.values) {
  if (value.number === 0) continue;
  const code = value.name.slice(CODE_PREFIX.length);
  codes.set(code, {
    code,
    stage: stageNames.get(getOption(value, default_stage)) ?? "execution",
    exposed: getOption(value, exposed),
    retryable: getOption(value, retryable),
    publicMessage: getOption(value, public_message),
    meaning: getOption(value, meaning),
  });
}

/** Every built-in error code's defaults, by code string. */
export const CODES: ReadonlyMap<string, CodeDefaults> = codes;

export const CONCEALED_CODE = "INTERNAL_ERROR";
export const CONCEALED_MESSAGE: string = codes.get(CONCEALED_CODE)?.publicMessage ?? "";
