/**
 * The one translation of an envelope into what a model is told.
 *
 * Adapters never unwrap an envelope and never look past the public face of
 * an error (SI-10): a success is the output as a model may see it (without
 * fields marked model-hidden), every other status is the error's `toModel()`
 * shape, one of exactly two (SI-9).
 */

import { compactJson } from "../canonical.js";
import type { Envelope } from "../envelope.js";
import { CapabilityError, type Json } from "../errors.js";

/** The code of the concealment class: unknown, unexposed and hidden alike (SI-8). */
export const CONCEALMENT_CODE = "CAPABILITY_NOT_FOUND";

/** What a model is told about one call. */
export interface ModelAnswer {
  /** The output (`succeeded`) or the model-safe error shape (every other status). */
  readonly value: Json;
  /** The call produced no output. */
  readonly isError: boolean;
  /** The value as compact, key-sorted JSON: the same bytes for the same answer. */
  readonly text: string;
  /** The capability is not there for this actor on this surface, or must appear not to be. */
  readonly concealsCapability: boolean;
}

/** Translate an envelope of any of the four statuses. */
export function answer(envelope: Envelope): ModelAnswer {
  if (envelope.status === "succeeded") return modelAnswer(envelope.modelOutput, false);
  return refusal(envelope.error);
}

/** An error thrown outside an envelope (discovery), as a model may see it. */
export function refusal(error: CapabilityError): ModelAnswer {
  return modelAnswer(error.toModel() as Json, true);
}

function modelAnswer(value: Json, isError: boolean): ModelAnswer {
  const text = compactJson(value);
  const sorted = JSON.parse(text) as Json;
  const code =
    isError && sorted !== null && typeof sorted === "object" && !Array.isArray(sorted)
      ? sorted.code
      : undefined;
  return { value: sorted, isError, text, concealsCapability: code === CONCEALMENT_CODE };
}

/** What a model is told when translation itself broke: the concealed shape. */
export const ADAPTER_FAILURE: ModelAnswer = refusal(
  new CapabilityError("INTERNAL_ERROR", undefined, { stage: "adapter" }),
);
