"""Example environments bundled with ors-grpc."""
