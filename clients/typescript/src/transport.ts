// How a request reaches the gateway. On Node: its own http(s) module with a keep-alive agent per client, which
// costs a fraction of fetch's time per request (bench phase `gateway` measures the client against the Python
// host). Anywhere else, or when the caller hands in a fetch: fetch. Imported when first used, so the package
// still loads where there is no node:http.

export interface Answer {
  status: number;
  text: string;
}

export type Transport = (method: string, url: string, headers: Record<string, string>, body: string | undefined,
  signal: AbortSignal | undefined) => Promise<Answer>;

export function fetchTransport(fetcher: typeof fetch): Transport {
  return async (method, url, headers, body, signal) => {
    const response = await fetcher(url, { method, headers, body, signal });
    return { status: response.status, text: await response.text() };
  };
}

/** Node's http or https, keeping connections alive; fetch where the runtime has no node:http. */
export async function nodeTransport(): Promise<Transport> {
  let http: typeof import("node:http");
  let https: typeof import("node:https");
  try {
    [http, https] = await Promise.all([import("node:http"), import("node:https")]);
  } catch {
    return fetchTransport(fetch);
  }
  const agents = { "http:": new http.Agent({ keepAlive: true }), "https:": new https.Agent({ keepAlive: true }) };
  return (method, url, headers, body, signal) => new Promise<Answer>((resolve, reject) => {
    const target = new URL(url);
    const request = (target.protocol === "https:" ? https : http).request(target, {
      method, signal, agent: agents[target.protocol as "http:" | "https:"],
      headers: body === undefined ? headers : { ...headers, "Content-Length": String(Buffer.byteLength(body)) },
    }, (response) => {
      const chunks: Buffer[] = [];
      response.on("data", (chunk: Buffer) => chunks.push(chunk));
      response.on("end", () => resolve({ status: response.statusCode ?? 0, text: Buffer.concat(chunks).toString("utf8") }));
      response.on("error", reject);
    });
    request.on("error", reject);
    request.end(body);
  });
}
