"""Environments' code in supervised worker processes (`--workers N`,
`--isolation episode`): `hosts.WorkerHosts` is the host factory
(`environment_host`'s second implementation), over `pool.WorkerPool`.
docs/workers.md maps the package, one concept per file, and has the design."""
