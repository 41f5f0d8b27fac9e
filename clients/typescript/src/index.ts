// treemail's host API for engines in any language, over `treemail gateway` (HTTP/JSON, /v1).
export { TreemailClient, GATEWAY_VERSION, isRefusal } from "./client.js";
export type { ClientOptions } from "./client.js";
export { TreemailError } from "./errors.js";
export type * from "./types.js";
