// Server-sent events (text/event-stream) read from a fetch body: the fields of each event, comments skipped.

export interface ServerSentEvent {
  event: string;
  data: string;
  id: string | undefined;
  retry: number | undefined;
}

/** The events of a stream as they arrive, parsed as the HTML standard's EventSource parses them; a block of
 *  comments alone (a heartbeat) comes as an event named "" with no data, so a reader can tell the stream lives. */
export async function* serverSentEvents(body: ReadableStream<Uint8Array>): AsyncGenerator<ServerSentEvent> {
  const decoder = new TextDecoder();
  let buffer = "";
  let event = "message";
  let data: string[] = [];
  let id: string | undefined;
  let retry: number | undefined;
  let comment = false;
  for await (const chunk of body as unknown as AsyncIterable<Uint8Array>) {
    buffer += decoder.decode(chunk, { stream: true });
    let end: number;
    while ((end = buffer.search(/\r\n|\r|\n/)) >= 0) {
      const line = buffer.slice(0, end);
      buffer = buffer.slice(end + (buffer.startsWith("\r\n", end) ? 2 : 1));
      if (line === "") {
        if (data.length > 0 || retry !== undefined) yield { event, data: data.join("\n"), id, retry };
        else if (comment) yield { event: "", data: "", id, retry };
        event = "message";
        data = [];
        retry = undefined;
        comment = false;
        continue;
      }
      if (line.startsWith(":")) { // a comment: the gateway's heartbeat
        comment = true;
        continue;
      }
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "event") event = value;
      else if (field === "data") data.push(value);
      else if (field === "id") id = value;
      else if (field === "retry" && /^\d+$/.test(value)) retry = Number(value);
    }
  }
}
