"""Making a live CPython run a file at its next safe point, in its main thread.

* CPython 3.8-3.13 on x86-64 Linux with glibc: eagle3-tui's own injector
  (:mod:`eagle3_tui.agent.ptrace`): ptrace stops only the main thread, for a
  millisecond or so, saves all of its registers (the whole extended state, AMX
  included), maps a page, copies a line of Python into it and calls
  ``Py_AddPendingCall(PyRun_SimpleString, page)``, then gives every register back.
* Where the injector cannot go (another CPU, musl, shadow stacks, an interpreter
  without the two functions: :func:`eagle3_tui.agent.ptrace.problem` says which), gdb,
  when it is on PATH and passes :func:`gdb_call_problem`. A command file attaches,
  loads only libpython's and libc's symbols (a PyTorch process maps hundreds of MB of
  others, which gdb would read with the trainer stopped: median 6.0 s measured,
  0.30 s this way), maps a fresh page, copies the line into it and makes the same
  call, then detaches. gdb stops every thread while it is attached.
* CPython 3.14+: ``sys.remote_exec(pid, file)`` (PEP 768), run by the target's own
  interpreter binary (both sides must be the same version).

Every way, the interpreter runs the line at its next safe point in its main thread;
if that thread is inside a long C call, the line waits there (queued).

Before gdb touches a trainer, :func:`gdb_call_problem` makes the same kind of call in
a throwaway child: a gdb that cannot give a process back its registers after a call
(Debian's gdb 13.1 on a CPU with AMX: ``Couldn't write extended state status: Bad
address``) leaves the process with a broken state (measured there: the sleep it was
in failed with errno 514 and the script died), so it is refused, never tried on the
trainer.

Standard library only (the agent).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from typing import Any

from eagle3_tui.agent import ptrace
from eagle3_tui.agent.pyprocess import container_hint
from eagle3_tui.telemetry.inject import ENTRY_NAME
from eagle3_tui.telemetry.safefs import trust_problem

TOOL_TIMEOUT_S = 60.0
PERMISSION = "permission"
"""The refusal reason when ptrace is refused although the checks passed."""


_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ./_-:,()=[]'")


def python_line(entry: str) -> str:
    """The Python that ``PyRun_SimpleString`` runs: the entry file, with every exception
    stopped here (one escaping would come out of the trainer's current bytecode as a
    SystemError, a SystemExit would end the process); a Ctrl+C that lands meanwhile
    is given back to the main thread. Any other exception is written to
    :func:`failed_file` (builtins only: the line can land in the middle of one of the
    trainer's imports, where ``import runpy`` finds ``os`` half made), so that it is
    said, and the injection tried again, never waited for in silence.

    Nor does it import anything while the thread it runs in is inside an import lock's
    ``acquire`` (Python 3.11 and older: ``importlib._bootstrap._blocking_on`` is a plain
    dict, one entry per thread): a nested import there deletes the outer one's entry,
    whose own ``del`` then raises ``KeyError`` out of the trainer's import (seen in CI:
    a line landing in ``import site`` killed the process). It says so instead, and is
    tried again. ``__import__('sys')`` takes no module lock (sys is never initializing).
    The line binds no name of the trainer's (no ``as e``, no ``f =``): it runs in the
    trainer's ``__main__``, whose globals a common name would overwrite or delete."""
    failed = failed_file(entry)
    importing = (  # (an expression: the line binds no name in the trainer's __main__)
        "type(getattr(__import__('sys').modules.get('_frozen_importlib'), '_blocking_on', "
        "None)) is dict and __import__('_thread').get_ident() in "
        "__import__('sys').modules['_frozen_importlib']._blocking_on"
    )
    error = "__eagle3_tui_error"  # (``except ... as`` deletes its name: one of its own)
    return (
        "try:\n"
        f" if {importing}:\n"
        "  raise ImportError('the trainer was taking an import lock: not now')\n"
        f" __import__('runpy').run_path({entry!r}, run_name={ENTRY_NAME!r})\n"
        "except KeyboardInterrupt:\n"
        " __import__('_thread').interrupt_main()\n"
        f"except BaseException as {error}:\n"
        " try:\n"
        f"  open({failed!r}, 'w').write(type({error}).__name__ + ': ' + str({error}))\n"
        " except BaseException:\n"
        "  pass\n"
    )


def failed_file(entry: str) -> str:
    """Where the injected line writes the exception that stopped the entry file."""
    return entry + ".failed"


def c_string(text: str) -> str:
    """``text`` as a C string literal for gdb: anything but plain characters as octal."""
    return '"' + "".join(chr(b) if b in _SAFE else f"\\{b:03o}" for b in text.encode()) + '"'


def gdb_script(pid: int, line: str, libpython: str | None) -> str:
    """Attach, load only libpython's and libc's symbols (a PyTorch process has hundreds
    of MB of others that gdb would read with the trainer stopped), queue the line,
    detach. An error in a command file stops it there; a signal inside a called
    function unwinds it (``unwindonsignal``); a failed mmap stops before the copy."""
    size = (len(line.encode()) // 4096 + 1) * 4096
    lines = [
        "set confirm off",
        "set pagination off",
        "set width 0",
        "set auto-solib-add off",
        "set unwindonsignal on",
        "shell date +EAGLE3_T0=%s.%N",
        f"attach {pid}",
    ]
    if libpython:
        lines.append(f"sharedlibrary {re.escape(os.path.basename(libpython))}")
    lines += [
        "sharedlibrary libc[.-]",
        f"set $buf = (char *) mmap(0, {size}, 3, 0x22, -1, 0)",
        "if (long) $buf == -1 || (long) $buf == 0",
        "  echo EAGLE3_MMAP_FAILED\\n",
        "else",
        f"  call (void) strcpy($buf, {c_string(line)})",
        "  print (int) Py_AddPendingCall((int (*)(void *)) PyRun_SimpleString, $buf)",
        "end",
        "detach",
        "shell date +EAGLE3_T1=%s.%N",
    ]
    return "\n".join(lines) + "\n"


def gdb_command(gdb: str, script: str) -> list[str]:
    return [
        gdb,
        "-nx",
        "-batch",
        "-iex",
        "set debuginfod enabled off",
        "-iex",
        "set auto-load off",
        "-x",
        script,
    ]


def parse_gdb(output: str) -> dict[str, Any]:
    """What gdb's output says: queued (``$1 = 0``), the stop time, or the problem."""
    out: dict[str, Any] = {"queued": False}
    t0 = re.search(r"EAGLE3_T0=(\d+\.\d+)", output)
    t1 = re.search(r"EAGLE3_T1=(\d+\.\d+)", output)
    if t0 and t1:
        out["stopped_ms"] = round((float(t1.group(1)) - float(t0.group(1))) * 1000.0, 1)
    value = re.search(r"^\$\d+ = (-?\d+)\s*$", output, re.M)
    if value is not None and value.group(1) == "0":
        out["queued"] = True
        return out
    if "Operation not permitted" in output and "ptrace" in output:
        out["reason"] = PERMISSION
        out["problem"] = "ptrace was refused (Operation not permitted)" + container_hint()
    elif XSTATE_BROKEN in output:
        out["problem"] = (
            "gdb could not give the trainer back its registers after the call "
            '("Couldn\'t write extended state status"): the trainer may fail; use a newer gdb'
        )
    elif "EAGLE3_MMAP_FAILED" in output:
        out["problem"] = "mmap failed in the trainer: nothing was queued"
    elif "No symbol" in output and "Py_AddPendingCall" in output:
        out["problem"] = "the interpreter does not export Py_AddPendingCall (a stripped build?)"
    elif value is not None:
        out["problem"] = f"Py_AddPendingCall returned {value.group(1)} (its queue is full?)"
    else:
        tail = " | ".join(ln for ln in output.strip().splitlines()[-4:] if ln.strip())
        out["problem"] = f"gdb did not queue the call: {tail[-400:]}"
    return out


XSTATE_BROKEN = "Couldn't write extended state"
"""gdb's words when it cannot write a process's registers back after a call."""
CANARY_S = 30.0


def gdb_call_problem(gdb: str) -> str | None:
    """Whether ``gdb`` can call a function in a process here and give it back its
    registers, tried on a throwaway child (``sleep``) exactly as the attach calls into
    the trainer; None when it can, else why not (one line, with the fix)."""
    sleeper = [shutil.which("sleep") or "/bin/sleep", str(int(CANARY_S))]
    try:
        child = subprocess.Popen(
            sleeper, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
    except OSError as e:
        return f"no process to try gdb on ({e})"
    try:
        time.sleep(0.05)  # exec'd and in its sleep
        script = "\n".join(
            [
                "set confirm off",
                "set auto-solib-add off",
                "set unwindonsignal on",
                f"attach {child.pid}",
                "sharedlibrary libc[.-]",
                "print (int) getpid()",
                "detach",
            ]
        )
        try:
            proc = run_gdb_script(gdb, script + "\n", "eagle3-tui-canary-")
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"gdb could not be tried on a throwaway process ({e})"
        output = proc.stdout + proc.stderr
        if XSTATE_BROKEN in output:
            return (
                f"{gdb_version(gdb)} cannot give a process back its registers after a "
                'call on this CPU ("Couldn\'t write extended state status", seen on a throwaway '
                "process): it would break the trainer. Use a newer gdb (first on PATH), or "
                "kill with a checkpoint and restart with telemetry"
            )
        if re.search(rf"^\$\d+ = {child.pid}\s*$", output, re.M) is None:
            if "Operation not permitted" in output and "ptrace" in output:
                return None  # ptrace itself: the plan's permission check speaks for that
            tail = " | ".join(ln for ln in output.strip().splitlines()[-3:] if ln.strip())
            return f"gdb could not call a function in a throwaway process: {tail[-300:]}"
        return None
    finally:
        child.kill()
        child.wait()


def gdb_version(gdb: str) -> str:
    """``gdb 13.1`` (from ``gdb --version``), or the path when it does not say."""
    try:
        first = _run_tool([gdb, "--version"]).stdout.splitlines()[0]
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return gdb
    m = re.search(r"(\d+\.\d+(?:\.\d+)?)\s*$", first)
    return f"gdb {m.group(1)}" if m else gdb


def _run_tool(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``argv`` (gdb, or the interpreter for ``sys.remote_exec``) with the tools'
    terms: no stdin, its output as text, stopped after :data:`TOOL_TIMEOUT_S`."""
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=TOOL_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def run_gdb_script(gdb: str, script: str, prefix: str) -> subprocess.CompletedProcess[str]:
    """gdb in batch mode on ``script`` (a command file of its own, removed after)."""
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=".gdb")
    try:
        os.write(fd, script.encode())
        os.close(fd)
        return _run_tool(gdb_command(gdb, path))
    finally:
        os.unlink(path)


def inject_ptrace(pid: int, entry: str, libpython: str | None) -> dict[str, Any]:
    """Queue the entry file's line with eagle3-tui's injector (in a forked child)."""
    return ptrace.queue_line(pid, python_line(entry).encode(), libpython)


def inject_gdb(gdb: str, pid: int, entry: str, libpython: str | None) -> dict[str, Any]:
    t0 = time.monotonic()
    try:
        proc = run_gdb_script(
            gdb, gdb_script(pid, python_line(entry), libpython), "eagle3-tui-attach-"
        )
    except subprocess.TimeoutExpired as e:
        return {
            "queued": False,
            "problem": f"gdb did not finish in {TOOL_TIMEOUT_S:.0f} s (it was stopped)",
            "output": str(e.output or "")[-2000:],
        }
    out = parse_gdb(proc.stdout + proc.stderr)
    out["tool_s"] = round(time.monotonic() - t0, 3)
    out["output"] = (proc.stdout + proc.stderr)[-2000:]
    return out


def remote_exec_command(exe: str, pid: int, entry: str) -> list[str]:
    """``sys.remote_exec`` run by the target's own interpreter binary (PEP 768 needs
    the same version on both sides); -I -S: nothing of the caller's environment."""
    return [
        exe,
        "-I",
        "-S",
        "-c",
        "import sys;sys.remote_exec(int(sys.argv[1]), sys.argv[2])",
        str(pid),
        entry,
    ]


def inject_remote_exec(exe: str, pid: int, entry: str) -> dict[str, Any]:
    t0 = time.monotonic()
    untrusted = trust_problem(exe)
    if untrusted is not None:  # the target's binary: never run one another user can change
        return {"queued": False, "problem": f"sys.remote_exec not run: {untrusted}"}
    try:
        proc = _run_tool(remote_exec_command(exe, pid, entry))
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"queued": False, "problem": f"sys.remote_exec did not run: {e}"}
    out: dict[str, Any] = {
        "queued": proc.returncode == 0,
        "tool_s": round(time.monotonic() - t0, 3),
    }
    if proc.returncode != 0:
        err = " ".join(proc.stderr.strip().splitlines()[-2:])[-400:]
        if "PermissionError" in err or "Operation not permitted" in err:
            out["reason"] = PERMISSION
            err += container_hint()
        out["problem"] = f"sys.remote_exec failed: {err}"
    return out
