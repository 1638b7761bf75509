/**
 * An MCP server (specification 2025-11-25) for a service's capabilities,
 * through the official `@modelcontextprotocol/sdk`.
 *
 * `tools/list` is what discovery shows the connected actor on the `mcp`
 * surface; `tools/call` invokes through the `Runtime`. A tool's name is its
 * capability id. The translation of every status is the Python SDK's
 * (`docs/reference/adapters.md`):
 *
 * - the concealment class (unknown id, unexposed surface, hidden by policy)
 *   answers the JSON-RPC protocol error for an unknown tool, `-32602`,
 *   identical for all three (SI-8);
 * - every other outcome is a tool result whose structured content, and text
 *   content as JSON, is the output without its model-hidden fields, or the
 *   model-safe error shape with `isError: true`.
 */

import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import {
  CallToolRequestSchema,
  type CallToolResult,
  ErrorCode,
  type JSONRPCMessage,
  ListToolsRequestSchema,
  type Tool,
} from "@modelcontextprotocol/sdk/types.js";
import type { DiscoveredCapability } from "../capability.js";
import { CapabilityError, type JsonObject } from "../errors.js";
import type { Runtime } from "../runtime.js";
import { ADAPTER_FAILURE, answer, type ModelAnswer, refusal } from "./translate.js";

export const SURFACE = "mcp";
/** The protocol error's message for the concealment class: the same for every tool. */
export const UNKNOWN_TOOL = "Unknown tool";

/** The actor's JWT, or a function of the request's extra data that returns one. */
export type ActorSource = string | ((extra: unknown) => string);

export interface McpOptions {
  actor: ActorSource;
  /** Attributes for policies (`context` in CEL); the plane adds `surface`. */
  context?: JsonObject;
  /** Cancels every call in progress, and every later one, when the service shuts down. */
  signal?: AbortSignal;
  /** The server's name (the service's name by default). */
  name?: string;
  version?: string;
}

/** A JSON-RPC error the SDK sends as it is: code, message and data. */
class ProtocolError extends Error {
  constructor(
    readonly code: number,
    message: string,
    readonly data: unknown,
  ) {
    super(message);
  }
}

/** An MCP server offering the runtime's capabilities to the actor `actor` names. */
export function buildServer(runtime: Runtime, options: McpOptions): Server {
  const server = new Server(
    { name: options.name ?? runtime.service, version: options.version ?? "" },
    { capabilities: { tools: {} } },
  );
  const actorOf = (extra: unknown) =>
    typeof options.actor === "string" ? options.actor : options.actor(extra);

  server.setRequestHandler(ListToolsRequestSchema, async (_request, extra) => {
    let discovered: DiscoveredCapability[];
    try {
      discovered = await runtime.discover({
        actor: actorOf(extra),
        surface: SURFACE,
        context: options.context ?? {},
      });
    } catch (error) {
      const face = error instanceof CapabilityError ? refusal(error) : ADAPTER_FAILURE;
      throw protocolError(ErrorCode.InternalError, face);
    }
    const served = runtime.capabilities;
    return { tools: discovered.filter((c) => served.has(c.id)).map(tool) };
  });

  server.setRequestHandler(CallToolRequestSchema, async (request, extra) => {
    let result: ModelAnswer;
    try {
      const signals = [extra.signal, options.signal].filter((s): s is AbortSignal => Boolean(s));
      const envelope = await runtime.invoke(request.params.name, request.params.arguments ?? {}, {
        actor: actorOf(extra),
        context: options.context ?? {},
        surface: SURFACE,
        signal: AbortSignal.any(signals),
      });
      result = answer(envelope);
    } catch {
      // Never let an exception's text out.
      result = ADAPTER_FAILURE;
    }
    if (result.concealsCapability) {
      throw protocolError(ErrorCode.InvalidParams, result, UNKNOWN_TOOL);
    }
    return toolResult(result);
  });
  return server;
}

/** Serve the runtime's capabilities over stdio until the client closes it. */
export async function serveStdio(runtime: Runtime, options: McpOptions): Promise<void> {
  const transport = new StdioServerTransport();
  await buildServer(runtime, options).connect(transport);
  answerUnreadable(transport);
}

/**
 * Answer each line that is not a JSON-RPC message as JSON-RPC 2.0 says (the
 * MCP SDK reports it as an error and answers nothing, and the client waits
 * for an answer that never comes): -32700 for text that is not JSON, -32600
 * for JSON that is not a message; `id` null, since none could be read. As the
 * Python adapter answers them.
 */
function answerUnreadable(transport: StdioServerTransport): void {
  const reported = transport.onerror;
  transport.onerror = (error: Error) => {
    const unreadable =
      error instanceof SyntaxError
        ? { code: ErrorCode.ParseError, message: "Parse error" }
        : error.name === "ZodError"
          ? { code: ErrorCode.InvalidRequest, message: "Invalid Request" }
          : null;
    if (unreadable !== null) {
      const answer = { jsonrpc: "2.0", id: null, error: unreadable };
      transport.send(answer as unknown as JSONRPCMessage).catch(() => {});
    }
    reported?.(error);
  };
}

function tool(capability: DiscoveredCapability): Tool {
  const read = capability.sideEffect === "read";
  return {
    name: capability.id,
    ...(capability.description ? { description: capability.description } : {}),
    inputSchema: capability.inputSchema as Tool["inputSchema"],
    annotations: {
      readOnlyHint: read,
      ...(read ? {} : { idempotentHint: capability.sideEffect === "idempotent" }),
    },
  };
}

/** The tool result for a translated answer (exported for the conformance vectors). */
export function toolResult(result: ModelAnswer): CallToolResult {
  const value = result.value;
  const structured =
    value !== null && typeof value === "object" && !Array.isArray(value) ? value : undefined;
  return {
    content: [{ type: "text", text: result.text }],
    ...(structured ? { structuredContent: structured } : {}),
    isError: result.isError,
  };
}

function protocolError(code: number, result: ModelAnswer, message?: string): ProtocolError {
  const value = result.value as { message?: string };
  return new ProtocolError(code, message ?? value.message ?? UNKNOWN_TOOL, result.value);
}
