"""Environments' code in supervised worker processes (`ors-grpc serve --workers N`).

- `hop`: the frames and messages between the server and a worker;
- `worker`: a worker process's entry point (`python -m ors_grpc._runtime.workers.worker`);
- `supervisor`: `WorkerHosts`, the host factory that starts the workers and
  places each episode in one of them (the second implementation of `environment_host`).
"""
