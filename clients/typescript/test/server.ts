// Where the tests find the server: ORS_TARGET (host:port), and ORS_API_KEY
// and ORS_TLS_CA (a PEM file to trust) when it needs them. The suites of
// test/echoenv/ expect it to host `echoenv` (tests/support/environments.py), those of
// test/openrewardenv/ `openrewardenv` (tests/support/openreward_dialect_env.py).
import { readFileSync } from "node:fs";
import type { ORSClientOptions } from "../src/index.js";

export const TARGET = process.env.ORS_TARGET ?? "127.0.0.1:50051";
export const API_KEY = process.env.ORS_API_KEY;
export const TLS_CA = process.env.ORS_TLS_CA;

/** TLS settings for the server: trust ORS_TLS_CA; none when it is unset. */
export function tlsOptions(): Pick<ORSClientOptions, "tls"> {
  return TLS_CA === undefined ? {} : { tls: { ca: readFileSync(TLS_CA) } };
}

/** Options that reach the server: TLS and the API key as it needs them. */
export function clientOptions(extra: ORSClientOptions = {}): ORSClientOptions {
  return { ...tlsOptions(), ...(API_KEY === undefined ? {} : { apiKey: API_KEY }), ...extra };
}
