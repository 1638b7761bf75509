/**
 * The Standard Schema interface (https://standardschema.dev), copied as its
 * authors intend so that no dependency is needed: Zod, Valibot, ArkType and
 * others implement it.
 */

export interface StandardSchemaV1<Input = unknown, Output = Input> {
  readonly "~standard": {
    readonly version: 1;
    readonly vendor: string;
    readonly validate: (value: unknown) => StandardResult<Output> | Promise<StandardResult<Output>>;
    readonly types?: { readonly input: Input; readonly output: Output } | undefined;
  };
}

export type StandardResult<Output> =
  | { readonly value: Output; readonly issues?: undefined }
  | { readonly issues: ReadonlyArray<StandardIssue> };

export interface StandardIssue {
  readonly message: string;
  readonly path?: ReadonlyArray<PropertyKey | { readonly key: PropertyKey }> | undefined;
}

/** An issue's path as a JSON Pointer, e.g. `/items/0/sku`. */
export function pointer(issue: StandardIssue): string {
  return (issue.path ?? [])
    .map((part) => (typeof part === "object" ? part.key : part))
    .map((key) => `/${String(key).replaceAll("~", "~0").replaceAll("/", "~1")}`)
    .join("");
}
