"""The shell side of the SSH backend: what runs on each node, as text.

Called by :class:`engine.launch.ssh.SshBackend`; pure functions returning shell commands, checked
by the SSH end-to-end tests against a real sshd. On each node the script runs under ``setsid``
(its own session and process group) inside a small bash wrapper that prints the group id first
(``@@dtrain-ready N``, consumed by the backend, never logged) and watches the SSH channel's
stdin: when the connection drops, stdin reaches EOF and the wrapper kills the group and every
process tagged with the run's ``DTRAIN_RUN_ID``. Nothing typed by the user reaches a remote shell
unquoted, except ``--remote-setup``, which is a shell command by design.

The script itself runs under :mod:`engine.launch.reaper` ``--node`` (sent in the bundle's tar as
:data:`engine.write.slurm.NODE_REAPER`; it needs only python3), the child subreaper that stops what a script leaves
behind in a session of its own, as on a local node; a node without a python3 for it runs the
script alone and says so in one line.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path, PurePosixPath

from engine.launch.policy import STOP_GRACE_S
from engine.write.quoting import env_line
from engine.write.slurm import NO_REAPER, NODE_REAPER, REAPER_PYTHON_OK

READY_RE = re.compile(rb"^@@dtrain-ready (\d+)$")
# What a wrapper's early exit status means (see node_wrapper).
EARLY_EXIT = {
    96: "--remote-setup failed",
    97: "cannot enter the remote work directory",
    98: "cannot receive or unpack the bundle (are head and tar installed?)",
    99: "start cancelled",
}

# Kill, on one node, every process whose environment carries DTRAIN_RUN_ID=$RID and
# DTRAIN_NODE=$NODE (torchrun starts its ranks in sessions of their own, so a process-group kill
# alone can miss them; the node number keeps two nodes of a run on one machine apart). Each
# NUL-separated entry is compared with the whole string "DTRAIN_RUN_ID=$RID" by bash itself
# (a quoted right-hand side of == is literal): no pattern language, so no character of a run id
# (a newline, a dot, a star) can make it match another process. Its status is 0 when it found
# one (``dtrain_sweep 0``: is anything of the run left?).
SWEEP_FN = (
    "dtrain_sweep() { local e p v r n found=1; for e in /proc/[0-9]*/environ; do p=${e#/proc/}; "
    "p=${p%/environ}; r=; n=; while IFS= read -r -d '' v; do "
    '[[ "$v" == "DTRAIN_RUN_ID=$RID" ]] && r=1; [[ "$v" == "DTRAIN_NODE=$NODE" ]] && n=1; '
    'done 2>/dev/null < "$e"; '
    'if [ -n "$r" ] && [ -n "$n" ]; then kill -"$1" "$p" 2>/dev/null && found=0; fi; '
    "done; return $found; }"
)
# Shell: wait up to STOP_GRACE_S for the run's processes to end after SIGTERM (``$1``: the
# process group, or empty), then SIGKILL what is left.
GRACE_FN = (
    f"dtrain_grace() {{ local i; for i in $(seq {int(STOP_GRACE_S * 5)}); do "
    '{ [ -n "$1" ] && kill -0 -- "-$1" 2>/dev/null; } || dtrain_sweep 0 || break; sleep 0.2; '
    'done; dtrain_sweep KILL; [ -n "$1" ] && kill -KILL -- "-$1" 2>/dev/null; true; }'
)


def remote_path_expr(workdir: str, rel: str) -> str:
    """Shell expression of ``rel`` under --remote-workdir: ``~`` is the remote $HOME; a relative
    path is under the login directory. Always absolute, always quoted."""
    if workdir == "~" or workdir.startswith("~/"):
        rest = workdir[2:].strip("/")
        return '"$HOME"/' + shlex.quote(str(PurePosixPath(rest) / rel) if rest else rel)
    if not workdir.startswith("/"):
        return '"$PWD"/' + shlex.quote(str(PurePosixPath(workdir) / rel))
    return shlex.quote(str(PurePosixPath(workdir) / rel))


def remote_dir_expr(workdir: str, run_id: str, node: int) -> str:
    """Shell expression of the node's fresh directory under --remote-workdir (one per node:
    on a shared filesystem, an NFS home, nodes must not race)."""
    return remote_path_expr(workdir, str(PurePosixPath(run_id) / f"node{node}"))


def node_wrapper(
    env: dict[str, str], node: int, *, script: str, setup: str | None, dir_expr: str, tar_size: int
) -> str:
    """The command that starts ``node``: its stdin first carries the bundle tar (exactly
    ``tar_size`` bytes, read by ``head -c``), then "go". ``env`` holds ``DTRAIN_RUN_ID`` and
    the rest of the node's environment."""
    env = dict(env)
    rid = env.pop("DTRAIN_RUN_ID")
    # The names are checked whole (a "reboot\n" would run on every node), the values quoted.
    exports = " ".join(f"export {env_line(k, v, 'env')};" for k, v in sorted(env.items()))
    inner = "\n".join(
        [
            f"RID={shlex.quote(rid)}",
            f"NODE={node}",
            SWEEP_FN,
            GRACE_FN,
            f"dir={dir_expr}",
            # Undo this node's part of a start that did not happen.
            'dtrain_clean() { cd / && rm -rf -- "$dir"; rmdir -- "${dir%/*}" 2>/dev/null; }',
            'mkdir -p -- "$dir" || exit 97',
            # The bundle, straight from the channel (no SFTP session, no file to unpack).
            f'head -c {tar_size} | tar -xf - -C "$dir" || {{ dtrain_clean; exit 98; }}',
            # --remote-setup is a shell command by design (e.g. activating an environment).
            "{",
            setup or ":",
            "} || { dtrain_clean; exit 96; }",
            exports or ":",
            'cd -- "$dir" || { dtrain_clean; exit 97; }',
            # Ready (and our process group id); then nothing runs until dtrain-tui says go.
            'echo "@@dtrain-ready $$"',
            'IFS= read -r go && [ "$go" = go ] || { dtrain_clean; exit 99; }',
            "exec 3<&0",
            # Under the child subreaper when python3 allows (daemons the script leaves behind
            # are stopped at its end), else the script alone, said in one line.
            f"if {REAPER_PYTHON_OK}; then set -- python3 -I ./{NODE_REAPER} --node; else "
            f"echo {shlex.quote(NO_REAPER.format(node=node))} >&2; set --; fi",
            f'DTRAIN_RUN_ID="$RID" DTRAIN_NODE=$NODE "$@" bash ./{shlex.quote(script)} </dev/null &',
            "child=$!",
            # The connection's stdin reaching EOF means the connection is gone (the launcher
            # exited or was killed, even with SIGKILL): clean up. The watcher is in the group
            # it signals: it ignores SIGTERM from then on, or that first kill would end it
            # before the sweep and the SIGKILL that follow (ranks that trap SIGTERM, or
            # left the group, would outlive the launcher). Until then SIGTERM ends it.
            "{ while read -r _; do :; done; trap '' TERM; kill -TERM -- -$$ 2>/dev/null; "
            # (Its own group would look alive to dtrain_grace: the group gets SIGKILL last.)
            "dtrain_sweep TERM; dtrain_grace ''; kill -KILL -- -$$ 2>/dev/null; "
            # Not the channel's stdout/stderr: they are gone with the connection, and a
            # write there (any error message) would end the watcher with SIGPIPE.
            "} <&3 >/dev/null 2>&1 &",
            "watcher=$!",
            "exec 3<&-",
            "wait $child; rc=$?",
            "kill $watcher 2>/dev/null",
            "exit $rc",
        ]
    )
    return f"exec setsid -w bash -c {shlex.quote(inner)}"


def stop_command(run_id: str, node: int, pgid: int | None) -> str:
    """SIGTERM the node's group and every process of the run on it, SIGKILL what is left after
    the grace period."""
    group = f"kill -TERM -- -{pgid} 2>/dev/null; " if pgid else ""
    return (
        f"RID={shlex.quote(run_id)}; NODE={node}; {SWEEP_FN}; {GRACE_FN}; "
        f"{group}dtrain_sweep TERM; dtrain_grace {pgid or shlex.quote('')}"
    )


def kill_now_command(run_id: str, node: int, pgid: int | None) -> str:
    """SIGKILL, at once, the node's group and every process of the run on it."""
    group = f"kill -KILL -- -{pgid} 2>/dev/null; " if pgid else ""
    return f"RID={shlex.quote(run_id)}; NODE={node}; {SWEEP_FN}; {group}dtrain_sweep KILL; true"


REACH_FILE = ".dtrain-reach-"
"""Prefix of the file node 0 writes in the checkpoint directory and every other node must read
back (:func:`ckpt_dir_of`, :class:`engine.launch.ssh.SshDriver`): proof that they share it."""


def ckpt_dir_of(bundle: Path, env: dict[str, str]) -> str | None:
    """The checkpoint directory every rank of ``bundle`` saves to when the launcher's ``env``
    is set, as the node scripts resolve it (``DTRAIN_CKPT_DIR``, else plan.json's checkpoint
    section); None when the run saves none (``DTRAIN_CKPT_EVERY`` or the section's ``every``
    is 0, or there is no section: a bundle not written by dtrain-tui)."""
    try:
        data = json.loads((bundle / "plan.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = None
    section = data.get("checkpoint") if isinstance(data, dict) else None
    section = section if isinstance(section, dict) else {}
    every = env.get("DTRAIN_CKPT_EVERY", str(section.get("every", 0)))
    where = env.get("DTRAIN_CKPT_DIR", section.get("dir"))
    if not isinstance(where, str) or not where or every.strip() in ("", "0"):
        return None
    return where


def reach_commands(where: str, run_id: str, token: str) -> tuple[str, str, str]:
    """Shell commands (write on node 0, check on each other node, clean up on node 0) that
    prove every node sees the same checkpoint directory ``where`` (absolute, or under ``~``)."""
    path = remote_path_expr(where, REACH_FILE + run_id)
    word = shlex.quote(token)
    write = f'f={path}; mkdir -p -- "${{f%/*}}" && printf "%s\\n" {word} > "$f"'
    check = f'f={path}; test "$(cat -- "$f" 2>/dev/null)" = {word}'
    clean = f'f={path}; rm -f -- "$f"'
    return write, check, clean
