"""What environment authors write against: `Environment`, `@tool`,
`@terminal`, `Toolset` and the ORS data types. The public names are
re-exported by ``ors_grpc`` itself (``from ors_grpc import Environment``)."""
