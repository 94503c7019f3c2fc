"""Bash snippets that several providers' `startup_blocks` share (jobs/startup.sh.j2 runs them).

Pure functions returning text; standard library only.
"""

from __future__ import annotations


def shutdown_at_deadline(why: str) -> str:
    """Bash for a provider's self_shutdown block: power the node off at `$DEADLINE_EPOCH` (at
    least a minute from now); `why` is a comment saying what that shutdown does on the cloud.
    Pure."""
    return f"""\
ct_minutes=$(( (DEADLINE_EPOCH - $(date +%s)) / 60 ))
if [ "$ct_minutes" -lt 1 ]; then ct_minutes=1; fi
# {why}
shutdown -h "+$ct_minutes" "cloudtrain: run deadline reached" ||
  phase "WARNING: could not arm the self-shutdown in $ct_minutes min\""""


def wait_for_driver(installer: str, timeout_s: int) -> str:
    """Bash for a provider's metadata block: on a node with an NVIDIA device, wait up to
    `timeout_s` for `installer` (an image's or extension's own driver install, running beside
    the startup script) to make nvidia-smi work, rather than install a second driver. Pure."""
    return f"""
if grep -qsi '0x10de' "$CT_SYS_PCI"/*/vendor && ! nvidia-smi >/dev/null 2>&1; then
  phase "driver: waiting for {installer}"
  upload_log # the controller sees what the node waits for
  ct_waited=0
  until nvidia-smi >/dev/null 2>&1; do
    if [ "$ct_waited" -ge {int(timeout_s)} ]; then
      fail "driver: nvidia-smi still fails after ${{ct_waited}}s of waiting for {installer}"
    fi
    sleep 10
    ct_waited=$((ct_waited + 10))
  done
fi"""


# A metadata service's curl (link-local: it answers in milliseconds or not at all): 2 s to
# connect, 10 s a try, retries 1 s apart and none after 60 s, so a call ends within ~70 s.
METADATA_CURL = (
    "curl -fsS --connect-timeout 2 --max-time 10 --retry 5 --retry-delay 1 --retry-max-time 60"
)


def node_address(fetch: str, what: str, prelude: str = "") -> str:
    """Bash for a provider's metadata block: unless $CLOUDTRAIN_NODE_HOST is set, the node's
    private address from `fetch` (a command printing it; `prelude` runs first, e.g. IMDSv2's
    token), exported as CLOUDTRAIN_NODE_HOST. Only an IPv4 address is taken: an error page or a
    proxy's refusal fails the boot naming the answer, so peers never dial a sentence. Pure."""
    return f"""\
if [ -z "${{CLOUDTRAIN_NODE_HOST:-}}" ]; then
{prelude}  ct_host="$({fetch})" ||
    fail "metadata: no {what} from the instance metadata service"
  if ! [[ "$ct_host" =~ ^([0-9]{{1,3}}\\.){{3}}[0-9]{{1,3}}$ ]]; then
    fail "metadata: the {what} answered is not an IPv4 address: '${{ct_host:0:80}}'"
  fi
  CLOUDTRAIN_NODE_HOST=$ct_host
fi
export CLOUDTRAIN_NODE_HOST"""
