"""Shared pytest fixtures: the fault-injecting HTTP server and moto's S3 server with SigV4
authentication enforced.  Both listen on 127.0.0.1 only, on ephemeral ports."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "servers"))

from faultserver import FaultServer  # noqa: E402


def pytest_configure(config):
    if not os.environ.get("MML_TEST_PACKAGE"):
        return  # nothing to check, and no import of mmloader before a test asks for it
    from child import check_package

    try:
        check_package()
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None


@pytest.fixture
def fault_server():
    """Factory: fault_server(objects=..., fault_rate=..., ...) -> a started FaultServer,
    stopped at the end of the test."""
    servers = []

    def make(**kw) -> FaultServer:
        srv = FaultServer(**kw).start()
        servers.append(srv)
        return srv

    yield make
    for s in servers:
        s.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class MotoS3:
    endpoint: str
    access_key: str
    secret_key: str = field(repr=False)
    region: str
    bucket: str
    client: object = field(repr=False)  # boto3 S3 client holding valid credentials

    def cfg(self, **over) -> dict:
        """Keyword arguments for mmloader's fetch functions."""
        d = dict(
            endpoint=self.endpoint,
            access_key=self.access_key,
            secret_key=self.secret_key,
            region=self.region,
        )
        d.update(over)
        return d

    def session_credentials(self) -> dict:
        """Temporary credentials (with a session token) from STS AssumeRole."""
        import boto3

        sts = boto3.client(
            "sts",
            endpoint_url=self.endpoint,
            region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )
        c = sts.assume_role(
            RoleArn="arn:aws:iam::123456789012:role/mml-role", RoleSessionName="mml"
        )["Credentials"]
        return dict(
            access_key=c["AccessKeyId"],
            secret_key=c["SecretAccessKey"],
            session_token=c["SessionToken"],
        )

    def put(self, key: str, data: bytes) -> str:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data)
        return f"s3://{self.bucket}/{key}"


@pytest.fixture(scope="session")
def moto_s3():
    """moto's S3 server in a subprocess.  An IAM user with an s3:* policy and an access key
    is created while authentication is still off; then authentication is switched on
    (POST /moto-api/reset-auth with 0 unauthenticated actions left), so every later
    request must carry a valid SigV4 signature of a known key: a wrong secret is refused."""
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("moto.server")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_ACCESS_KEY_ID="bootstrap",
        AWS_SECRET_ACCESS_KEY="bootstrap",
        AWS_DEFAULT_REGION="us-east-1",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.skip("moto server did not start")
                time.sleep(0.1)
        boot = dict(
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="bootstrap",
            aws_secret_access_key="bootstrap",
        )
        iam = boto3.client("iam", **boot)
        iam.create_user(UserName="mml")
        allow = (
            '{"Version":"2012-10-17","Statement":[{"Effect":"Allow",'
            '"Action":["s3:*","sts:AssumeRole"],"Resource":"*"}]}'
        )
        iam.put_user_policy(UserName="mml", PolicyName="s3all", PolicyDocument=allow)
        # a role the user may assume: its temporary credentials carry a session token
        iam.create_role(
            RoleName="mml-role",
            AssumeRolePolicyDocument=(
                '{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"sts:AssumeRole",'
                '"Principal":{"AWS":"arn:aws:iam::123456789012:user/mml"}}]}'
            ),
        )
        iam.put_role_policy(RoleName="mml-role", PolicyName="s3all", PolicyDocument=allow)
        key = iam.create_access_key(UserName="mml")["AccessKey"]
        bucket = "mml-test"
        boto3.client("s3", **boot).create_bucket(Bucket=bucket)
        req = urllib.request.Request(
            endpoint + "/moto-api/reset-auth",
            data=b"0",
            method="POST",
            headers={"Content-Type": "text/plain"},
        )
        urllib.request.urlopen(req, timeout=10).read()
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id=key["AccessKeyId"],
            aws_secret_access_key=key["SecretAccessKey"],
        )
        yield MotoS3(
            endpoint, key["AccessKeyId"], key["SecretAccessKey"], "us-east-1", bucket, client
        )
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ---- shared assertions -------------------------------------------------------------------


def _as_np(t):
    if not isinstance(t, np.ndarray) and "bfloat16" in str(getattr(t, "dtype", "")):
        import torch  # NumPy has no bfloat16: compare its bits

        t = t if isinstance(t, torch.Tensor) else torch.from_dlpack(t)
        return t.cpu().view(torch.int16).numpy()
    return t.numpy() if hasattr(t, "numpy") and not isinstance(t, np.ndarray) else np.asarray(t)


def _dtype_name(t):
    return str(t.dtype).replace("torch.", "")


def n_threads() -> int:
    """This process's threads, as the kernel lists them."""
    return len(os.listdir("/proc/self/task"))


def _down_to(count, base: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while (n := count()) > base and time.monotonic() < deadline:
        time.sleep(0.01)
    return n


def threads_down_to(base: int, timeout: float = 5.0) -> int:
    """The thread count once it is at most `base`, else after `timeout` seconds: a thread
    that pthread_join has returned for stays in /proc/self/task until the kernel has
    reaped it, a moment later, so a count taken right after a join can be one high."""
    return _down_to(n_threads, base, timeout)


def n_fds() -> int:
    """This process's open file descriptors."""
    return len(os.listdir("/proc/self/fd"))


def fds_down_to(base: int, timeout: float = 5.0) -> int:
    """The descriptor count once it is at most `base`, else after `timeout` seconds: a
    descriptor another thread of the process holds for a moment (a server handler of an
    earlier test finishing its socket, a thread being reaped) must not read as a leak; a
    descriptor the loader really leaks stays, and the count stays above `base`."""
    return _down_to(n_fds, base, timeout)


def same(a, b):
    """Bitwise-equal batches: one batch (a dict of arrays or tensors) or a NON-EMPTY list of
    them (an empty epoch on both sides is a failure, not a match): same keys, dtypes,
    shapes and bytes.  A value None (an adapter's absent tensor) must be None in both."""
    if isinstance(a, dict):
        a, b = [a], [b]
    assert len(a) == len(b), (len(a), len(b))
    assert len(a) > 0, "no batches to compare"
    for x, y in zip(a, b):
        assert sorted(x) == sorted(y)
        for k in x:
            if x[k] is None or y[k] is None:
                assert x[k] is None and y[k] is None, k
                continue
            assert _dtype_name(x[k]) == _dtype_name(y[k]), k
            u, v = _as_np(x[k]), _as_np(y[k])
            assert u.dtype == v.dtype and u.shape == v.shape, k
            assert np.array_equal(u, v), k


def as_np(batch):
    """A batch of the loader as NumPy arrays that outlive it (copies)."""
    return {k: np.array(v.numpy(), copy=True) for k, v in batch.items()}


def take(loader, n):
    """The next n batches of `loader` (as_np), across epoch ends.  An epoch that ends
    before it gave a batch fails (a loader stuck at an end would otherwise never stop)."""
    out, it, ended = [], iter(loader), False
    while len(out) < n:
        try:
            out.append(as_np(next(it)))
            ended = False
        except StopIteration:
            assert not ended, f"an empty epoch after {len(out)} of {n} batches"
            ended = True
    return out
