// A TCP proxy in front of the server that can break its connections on
// demand, to test what the client does when a stream breaks mid-call.
import net from "node:net";

export class BreakingProxy {
  /** How many client connections it accepted. */
  connections = 0;
  private readonly server: net.Server;
  private readonly pairs = new Set<[net.Socket, net.Socket]>();
  private dropping: (() => void) | undefined;
  private refusals = 0;

  private constructor(upstreamHost: string, upstreamPort: number) {
    this.server = net.createServer((downstream) => {
      this.connections += 1;
      if (this.refusals > 0) {
        this.refusals -= 1;
        downstream.destroy();
        return;
      }
      const upstream = net.connect(upstreamPort, upstreamHost);
      const pair: [net.Socket, net.Socket] = [downstream, upstream];
      this.pairs.add(pair);
      downstream.on("data", (chunk) => this.forward(chunk, upstream));
      upstream.on("data", (chunk) => downstream.write(chunk));
      for (const socket of pair) {
        socket.on("error", () => {});
        socket.on("close", () => this.cutPair(pair));
      }
    });
  }

  /** Starts a proxy to `target` (host:port) on a free loopback port. */
  static async start(target: string): Promise<BreakingProxy> {
    const [host, port] = splitTarget(target);
    const proxy = new BreakingProxy(host, port);
    await new Promise<void>((resolve) => proxy.server.listen(0, "127.0.0.1", resolve));
    return proxy;
  }

  get target(): string {
    return `127.0.0.1:${(this.server.address() as net.AddressInfo).port}`;
  }

  /** Breaks every open connection (both sides); new ones are accepted as before. */
  cut(): void {
    for (const pair of this.pairs) this.cutPair(pair);
  }

  /** Breaks every open connection, and closes the next `count` ones as soon as they are accepted. */
  cutAndRefuse(count: number): void {
    this.cut();
    this.refusals = count;
  }

  /** Drops the next bytes the client sends, unforwarded, and then breaks every connection. */
  dropNextSendAndCut(): Promise<void> {
    return new Promise((resolve) => {
      this.dropping = () => {
        this.dropping = undefined;
        this.cut();
        resolve();
      };
    });
  }

  async stop(): Promise<void> {
    this.cut();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private forward(chunk: Buffer, upstream: net.Socket): void {
    if (this.dropping !== undefined) this.dropping();
    else upstream.write(chunk);
  }

  private cutPair(pair: [net.Socket, net.Socket]): void {
    this.pairs.delete(pair);
    for (const socket of pair) socket.destroy();
  }
}

function splitTarget(target: string): [string, number] {
  const colon = target.lastIndexOf(":");
  return [target.slice(0, colon), Number(target.slice(colon + 1))];
}
