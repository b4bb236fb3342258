"""Fixtures of the fault-injection suite: an MLflow tracking server that a test can stop and start
again on the same port (`tests.helpers.TrackingServer`). Ray on loopback, the data slice and its
token cache: tests/conftest.py."""

from __future__ import annotations

import pytest

from tests.helpers import TrackingServer


@pytest.fixture
def tracking_server(tmp_path):
    server = TrackingServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()
