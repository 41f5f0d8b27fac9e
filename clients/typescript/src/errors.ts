import type { ErrorDetail } from "./types.js";

/**
 * A refusal by treemail or the gateway: `code` is the stable code the Python host uses
 * (`lifecycle:run_active`, `message:unknown`, `gateway:invalid_request`, ...), never reworded.
 */
export class TreemailError extends Error {
  readonly code: string;
  /** The HTTP status the gateway answered with; 0 when it could not be reached. */
  readonly status: number;
  /** On a refusal that may pass later (429): when to try again. */
  readonly retryAfterMs: number | undefined;
  readonly detail: ErrorDetail;

  constructor(status: number, detail: ErrorDetail) {
    super(`${detail.code}: ${detail.message}`);
    this.name = "TreemailError";
    this.code = detail.code;
    this.status = status;
    this.retryAfterMs = detail.retry_after_ms;
    this.detail = detail;
  }
}
