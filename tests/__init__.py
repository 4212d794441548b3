"""Tests of ors-grpc."""
