"""A node's address comes from its cloud's metadata service, and only an IPv4 address is taken:
an error page or a proxy's refusal (this sandbox answers 169.254.169.254 with `resolve_deny:
denied destination`) must fail the boot clearly, never become the address peers dial."""

from __future__ import annotations

import subprocess

import pytest

from cloudtrain.providers.aws import compute as aws
from cloudtrain.providers.azure import startup as azure
from cloudtrain.providers.gcp import compute as gcp

SNIPPETS = {"aws": aws._METADATA, "gcp": gcp._METADATA, "azure": azure._METADATA}


def _boot(snippet: str, answer: str, status: int = 0) -> subprocess.CompletedProcess[str]:
    """Run the snippet under bash with `curl` answering `answer` (exit `status`)."""
    script = f"""
set -euo pipefail
fail() {{ echo "FAILED: $*"; exit 3; }}
curl() {{ printf '%s' {answer!r}; return {status}; }}
unset CLOUDTRAIN_NODE_HOST
{snippet}
echo "host=$CLOUDTRAIN_NODE_HOST"
"""
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("cloud", sorted(SNIPPETS))
def test_an_ipv4_answer_is_the_node_address(cloud: str) -> None:
    done = _boot(SNIPPETS[cloud], "10.0.1.7")
    assert done.returncode == 0 and done.stdout.strip().endswith("host=10.0.1.7"), done


@pytest.mark.parametrize("answer", ["resolve_deny: denied destination", "<html>404</html>", ""])
@pytest.mark.parametrize("cloud", sorted(SNIPPETS))
def test_anything_else_fails_the_boot_naming_the_answer(cloud: str, answer: str) -> None:
    done = _boot(SNIPPETS[cloud], answer)
    assert done.returncode == 3, done
    assert "FAILED: metadata:" in done.stdout and "not an IPv4 address" in done.stdout, done
    assert "host=" not in done.stdout


@pytest.mark.parametrize("cloud", sorted(SNIPPETS))
def test_an_http_error_is_a_failed_fetch(cloud: str) -> None:
    """curl -f: an HTTP error status is an error, not a body to read as the address."""
    assert "curl -fsS" in SNIPPETS[cloud].replace("\\\n", " ")
    done = _boot(SNIPPETS[cloud], "", status=22)
    assert done.returncode == 3 and "FAILED: metadata:" in done.stdout, done
