/** Where the repository's shared files are, from the compiled test (dist/test/). */

import { fileURLToPath } from "node:url";

export const REPO = fileURLToPath(new URL("../../../../", import.meta.url));
export const VECTORS = fileURLToPath(new URL("../../../../tests/conformance/", import.meta.url));
