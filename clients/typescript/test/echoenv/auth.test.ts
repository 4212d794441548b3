// Against a server started with `--api-key` (ORS_API_KEY) or TLS
// (ORS_TLS_CA): clients without the key, or without trust in the server's
// certificate, are refused.
import assert from "node:assert/strict";
import { test } from "node:test";
import { Code, ErrorReason, ORSClient, ORSError } from "../../src/index.js";
import { API_KEY, TARGET, TLS_CA, clientOptions, tlsOptions } from "../server.js";

async function refusal(client: ORSClient): Promise<ORSError> {
  try {
    const names = await client.listEnvironments();
    assert.fail(`expected a refusal, got ${names}`);
  } catch (error) {
    assert.ok(error instanceof ORSError, String(error));
    return error;
  } finally {
    client.close();
  }
}

test("a call without the API key, or with a wrong one, is UNAUTHENTICATED", { skip: API_KEY === undefined && "needs ORS_API_KEY" }, async () => {
  for (const apiKey of [undefined, `${API_KEY}-wrong`]) {
    const error = await refusal(new ORSClient(TARGET, { ...tlsOptions(), ...(apiKey === undefined ? {} : { apiKey }) }));
    assert.equal(error.code, Code.Unauthenticated);
    assert.equal(error.reason, ErrorReason.UNAUTHENTICATED);
  }
});

test("a client that does not trust the server's certificate, or speaks plaintext, is refused", { skip: TLS_CA === undefined && "needs ORS_TLS_CA" }, async () => {
  const untrusting = await refusal(new ORSClient(TARGET, clientOptions({ tls: true })));
  assert.match(untrusting.detail, /certificate/i);
  const plaintext = await refusal(new ORSClient(TARGET, clientOptions({ tls: false })));
  assert.equal(plaintext.reason, ErrorReason.UNSPECIFIED);
});
