"""eagle3-tui's own injector: a line of Python queued into a live CPython 3.8-3.13 on
x86-64 Linux (glibc) through ptrace, with the standard library only (ctypes).

Why not gdb: on a CPU with AMX (Sapphire Rapids and later Xeons: DGX H100/H200 class
servers) a thread's extended register state (``NT_X86_XSTATE``) is 11008 bytes, and
the kernel writes it back only at exactly its size. gdb 12 and 13 (Ubuntu 22.04,
Debian 12) write 2696 bytes, fail, never give back ``orig_rax``, and the trainer's
next syscall fails (errno 514 out of ``time.sleep``: ``shared/notes/live-attach.md``).

Only the main thread is traced and stopped; the other threads, the dataloader
workers and the GPU work go on:

1. ``PTRACE_SEIZE``, ``PTRACE_INTERRUPT``: the main thread stops, inside a syscall too
   (woken as a signal would wake it; its registers say how to restart that syscall).
2. Its general registers and its whole extended state are saved, at the size the
   kernel gives (read into a large buffer; AMX included).
3. A fresh page is mapped by pointing the registers at an existing ``syscall``
   instruction of libc and single-stepping it (``mmap`` takes no allocator lock the
   stopped thread may hold). No code is written into the process.
   ``Py_IsInitialized()`` is called first the same way as step 5: an interpreter still
   starting (or exiting) would lose the line; it is tried again (:data:`READY_WAIT_S`).
4. The line goes into that page through ``/proc/PID/mem``.
5. ``Py_AddPendingCall(PyRun_SimpleString, page)`` is called with its return address
   at an existing ``0xCC`` byte of libc, so that it ends in a SIGTRAP seen here;
   ``orig_rax`` is -1 meanwhile (nothing restarts in the middle of the call).
6. The extended state, then the general registers, the original ``orig_rax`` and
   ``rax`` included (an interrupted syscall restarts as after any signal), are
   written back, read back to check, and the thread is let go (``PTRACE_DETACH``).

The interpreter runs the line at its next safe point in its main thread; while that
thread is in a long C call the line waits (queued), as with gdb. The page stays (4 KiB
per injection): the interpreter reads the line from it then.

Should the main thread hold the interpreter's pending-call lock at the stop (the few
instructions in which it takes a queued call out, so only right after another
injection), the call cannot take it: past :data:`CALL_TIMEOUT_S` the thread is
stopped again, its saved state put back, and nothing is queued. Py_AddPendingCall
itself, as built here, touches no vector register (the extended state read back
after the call was identical); it is saved and written back all the same, since
another build may.

Signals that reach the main thread meanwhile stop it here first: each is held (taken
out of the way of the call) and given back once its registers are, the first as
the detach's own signal with its original siginfo, any others queued again to the
thread (with their siginfo where the kernel lets another process queue it, else
as the same signal from this process). The kernel then delivers them as if they had
arrived a few milliseconds later: a handler runs, a syscall they interrupt returns
EINTR or restarts (SA_RESTART) as it would have. A fault inside the call (it would kill the
trainer) is caught the same way: the saved state is put back, nothing is queued.

Addresses come from the process's own memory: the dynamic symbol table of libpython
(or of the executable, when libpython is linked into it) is looked up through
``/proc/PID/mem`` by its GNU or SysV hash, as the dynamic linker does, so a file
replaced on disk since, or another mount namespace, changes nothing.

It runs in a forked child of the agent (:func:`queue_line`): if that child dies, its
exit detaches the trainer. The main thread of a PyTorch process is stopped a median
1.0 ms when it sleeps (worst of 20: 3.3 ms), 3.7-4.9 ms when it is busy (worst
16 ms, mostly waiting for a CPU: 2 cores shared with other jobs), against 330-540 ms
for gdb (``benchmarks/bench_attach.py``).

Refused (:func:`problem`, with the reason) until supported: another CPU than x86-64
(aarch64: Grace, GH200), a 32-bit interpreter, musl libc, CET shadow stacks (the
call's fake return would fault), an interpreter that does not export both functions.

Standard library only, Python 3.8+ (the agent).

Over 600 lines: ptrace, the register layouts, the remote call and its restoration are
one careful sequence on a live process; splitting it would hide the order that keeps the
trainer safe.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import select
import signal
import struct
import time
from typing import Any, NamedTuple

from eagle3_tui.agent.pyprocess import container_hint, read_text
from eagle3_tui.telemetry.parsing import parse_json

PTRACE_CONT = 7
PTRACE_SINGLESTEP = 9
PTRACE_GETREGS = 12
PTRACE_SETREGS = 13
PTRACE_DETACH = 17
PTRACE_GETSIGINFO = 0x4202
PTRACE_SETSIGINFO = 0x4203
PTRACE_GETREGSET = 0x4204
PTRACE_SETREGSET = 0x4205
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
PTRACE_EVENT_STOP = 128
NT_X86_XSTATE = 0x202
WALL = 0x40000000
"""``__WALL``: wait for a traced thread whatever kind it is."""
SYS_MMAP = 9
SYS_TGKILL = 234
SYS_RT_TGSIGQUEUEINFO = 297
SI_TKILL = -6
EM_X86_64 = 62
TF, DF = 0x100, 0x400
"""The trap and direction flags: cleared for the call (the ABI wants DF clear)."""
MINUS_ONE = (1 << 64) - 1
RED_ZONE = 128
XSTATE_START = 1 << 16
"""The first buffer for the extended state (11008 bytes with AMX); grown if filled."""
SIGINFO_SIZE = 128
FAULTS = frozenset((signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGTRAP))
"""Signals that, with a kernel's ``si_code`` (> 0), mean the call itself faulted."""

STOP_TIMEOUT_S = 2.0
"""How long the main thread may take to stop (a thread in uninterruptible sleep, e.g.
inside a GPU driver call, stops only when it leaves it)."""
CALL_TIMEOUT_S = 2.0
"""How long the mmap or the call may take before the saved state is put back."""
CHILD_TIMEOUT_S = 15.0
"""The forked injector's limit, all steps together (it keeps its own, shorter ones)."""
SPIN_S = 0.005
"""Waits poll without sleeping this long (a stop or the call takes microseconds)."""

REGISTERS = (
    "r15",
    "r14",
    "r13",
    "r12",
    "rbp",
    "rbx",
    "r11",
    "r10",
    "r9",
    "r8",
    "rax",
    "rcx",
    "rdx",
    "rsi",
    "rdi",
    "orig_rax",
    "rip",
    "cs",
    "eflags",
    "rsp",
    "ss",
    "fs_base",
    "gs_base",
    "ds",
    "es",
    "fs",
    "gs",
)
"""``struct user_regs_struct`` (x86-64), in order."""
_REGISTER = {name: i for i, name in enumerate(REGISTERS)}
_REGS_FORMAT = f"<{len(REGISTERS)}Q"

_GLIBC = re.compile(r"^libc(?:\.so\.\d+|-\d+\.\d+\.so)$")
_MUSL = re.compile(r"^(?:ld-musl-|libc\.musl-)")
_LIBPYTHON = re.compile(r"/libpython3\.\d+[a-z]*\.so")


class UnsupportedError(Exception):
    """The injector cannot be used on this process (the message says why)."""


class GoneError(Exception):
    """The process exited (or was killed) while it was traced."""


class LateError(Exception):
    """A stop did not come in time."""


class FaultedError(Exception):
    """The call made in the process faulted; its state was put back."""


NOT_READY = "not_ready"
"""The outcome's ``reason`` when the interpreter is not initialized (starting or exiting)."""
READY_WAIT_S = 5.0
"""How long :func:`inject` tries again an interpreter that is still starting."""
READY_RETRY_S = 0.2


# ---- what the process looks like, read without stopping it ------------------------


class Mapping(NamedTuple):
    start: int
    end: int
    perms: str
    offset: int
    path: str


def mappings(pid: int) -> list[Mapping]:
    """``/proc/PID/maps``, file-backed mappings only."""
    out = []
    for line in (read_text(f"/proc/{pid}/maps") or "").splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        lo, _, hi = parts[0].partition("-")
        with contextlib.suppress(ValueError):
            out.append(Mapping(int(lo, 16), int(hi, 16), parts[1], int(parts[2], 16), parts[5]))
    return out


class Memory:
    """Another process's memory through ``/proc/PID/mem`` (the same access as ptrace)."""

    def __init__(self, pid: int, write: bool = False) -> None:
        self.fd = os.open(f"/proc/{pid}/mem", (os.O_RDWR if write else os.O_RDONLY) | os.O_CLOEXEC)

    def read(self, address: int, size: int) -> bytes:
        data = os.pread(self.fd, size, address)
        if len(data) != size:
            raise OSError(f"short read at {address:#x}")
        return data

    def write(self, address: int, data: bytes) -> None:
        if os.pwrite(self.fd, data, address) != len(data):
            raise OSError(f"short write at {address:#x}")

    def close(self) -> None:
        os.close(self.fd)


class Addresses(NamedTuple):
    """Where the injection goes in one process."""

    add_pending_call: int
    run_simple_string: int
    is_initialized: int
    """``Py_IsInitialized``: called first; a line queued into an interpreter that is still
    starting is lost (its pending calls are set up again after it; measured: 12 of 100
    injections right after the exec ran nothing), one that is exiting never runs."""
    syscall: int
    """An existing ``syscall`` instruction (0f 05) in libc's code."""
    trap: int
    """An existing 0xCC byte (``int3``) in libc's code: the call's return address."""
    symbols_from: str
    """The object the two functions were found in (libpython or the executable)."""


def machine_problem() -> str | None:
    machine = os.uname().machine
    if machine != "x86_64":
        return f"eagle3-tui's injector supports x86-64 only for now; this host is {machine}"
    return None


def shadow_stack(pid: int) -> bool:
    """Whether the main thread runs with CET shadow stacks (``x86_Thread_features``)."""
    for line in (read_text(f"/proc/{pid}/status") or "").splitlines():
        if line.startswith("x86_Thread_features:"):
            return "shstk" in line.split(":", 1)[1].split()
    return False


def tracer(pid: int) -> int:
    """The PID tracing ``pid`` (a debugger, strace, py-spy), 0 when none."""
    for line in (read_text(f"/proc/{pid}/status") or "").splitlines():
        if line.startswith("TracerPid:"):
            with contextlib.suppress(ValueError):
                return int(line.split(":", 1)[1])
    return 0


def locate(pid: int, libpython: str | None) -> Addresses:
    """The addresses the injection needs in ``pid`` (the functions from ``libpython``,
    else from a libpython mapped there, else from the executable);
    :class:`UnsupportedError` says why it cannot be done there."""
    problem = machine_problem()
    if problem is not None:
        raise UnsupportedError(problem)
    if shadow_stack(pid):
        raise UnsupportedError(
            f"pid {pid} runs with CET shadow stacks (x86_Thread_features: shstk): a call "
            "made into it through ptrace would fault on return"
        )
    maps = mappings(pid)
    if not maps:
        raise UnsupportedError(f"/proc/{pid}/maps cannot be read")
    musl = sorted({os.path.basename(m.path) for m in maps if _MUSL.match(os.path.basename(m.path))})
    if musl:
        raise UnsupportedError(
            f"pid {pid} uses musl libc ({musl[0]}): eagle3-tui's injector supports glibc only"
        )
    try:
        mem = Memory(pid)
    except OSError as e:
        raise UnsupportedError(f"pid {pid}'s memory cannot be read: {e.strerror or e}") from None
    try:
        syscall, trap = _libc_code(pid, maps, mem)
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            exe = ""
        tried = []
        names = (b"Py_AddPendingCall", b"PyRun_SimpleString", b"Py_IsInitialized")
        found: dict[bytes, int] = {}
        mapped = [m.path for m in maps if _LIBPYTHON.search(m.path)]
        for path in (libpython, *mapped, exe):
            if not path or path in tried:
                continue
            tried.append(path)
            found = _symbols(mem, maps, path, names)
            if len(found) == len(names):
                return Addresses(
                    found[names[0]], found[names[1]], found[names[2]], syscall, trap, path
                )
        missing = " and ".join(n.decode() for n in names if n not in found) if tried else ""
        raise UnsupportedError(
            f"pid {pid}'s interpreter does not export {missing or 'the C API'} "
            f"({' nor '.join(tried) or 'nothing mapped'}): a stripped build?"
        )
    finally:
        mem.close()


def problem(pid: int, libpython: str | None) -> str | None:
    """Why the injector cannot be used on ``pid`` (one line), or None."""
    try:
        locate(pid, libpython)
    except UnsupportedError as e:
        return str(e)
    return None


def _libc_code(pid: int, maps: list[Mapping], mem: Memory) -> tuple[int, int]:
    """A ``syscall`` instruction and an ``int3`` byte in glibc's executable mapping."""
    code = [m for m in maps if "x" in m.perms and _GLIBC.match(os.path.basename(m.path))]
    if not code:
        raise UnsupportedError(f"no glibc is mapped in pid {pid} (a static binary?)")
    syscall = trap = 0
    for m in code:
        at = m.start
        while at < m.end and not (syscall and trap):
            size = min(1 << 16, m.end - at)
            try:
                chunk = mem.read(at, size)
            except OSError:
                break
            if not syscall:
                i = chunk.find(b"\x0f\x05")
                syscall = at + i if i >= 0 else 0
            if not trap:
                i = chunk.find(b"\xcc")
                trap = at + i if i >= 0 else 0
            at += size - 1  # one byte again: an instruction across two chunks
        if syscall and trap:
            return syscall, trap
    raise UnsupportedError(f"no syscall instruction and int3 byte found in pid {pid}'s libc")


def _symbols(
    mem: Memory, maps: list[Mapping], path: str, names: tuple[bytes, ...]
) -> dict[bytes, int]:
    """The run-time addresses of ``names`` in the dynamic symbol table of the object
    mapped from ``path``, read from memory; those not found are left out."""
    first = [m for m in maps if m.path == path and m.offset == 0]
    if not first:
        return {}
    base = min(m.start for m in first)
    try:
        return _lookup(mem, base, names)
    except (OSError, OverflowError, struct.error, ValueError, IndexError) as e:
        raise UnsupportedError(f"the dynamic symbols of {path} cannot be read: {e}") from None


def _lookup(mem: Memory, base: int, names: tuple[bytes, ...]) -> dict[bytes, int]:
    ehdr = mem.read(base, 64)
    if ehdr[:4] != b"\x7fELF":
        raise ValueError("no ELF header where it is mapped")
    if ehdr[4] != 2 or ehdr[5] != 1 or struct.unpack_from("<H", ehdr, 18)[0] != EM_X86_64:
        raise UnsupportedError("the interpreter is not a 64-bit x86-64 program")
    phoff = struct.unpack_from("<Q", ehdr, 32)[0]
    phentsize, phnum = struct.unpack_from("<HH", ehdr, 54)
    if phentsize != 56 or not 0 < phnum <= 256:
        raise ValueError("unexpected program headers")
    headers = mem.read(base + phoff, phentsize * phnum)
    loads: list[int] = []
    dynamic = None
    for i in range(phnum):
        p_type, _, _, vaddr, _, _, memsz, _ = struct.unpack_from("<IIQQQQQQ", headers, i * 56)
        if p_type == 1:  # PT_LOAD
            loads.append(vaddr)
        elif p_type == 2:  # PT_DYNAMIC
            dynamic = (vaddr, memsz)
    if not loads or dynamic is None:
        raise ValueError("no PT_DYNAMIC")
    bias = base - (min(loads) & ~0xFFF)
    raw = mem.read(bias + dynamic[0], min(dynamic[1], 1 << 16) // 16 * 16)
    tags: dict[int, int] = {}
    for i in range(0, len(raw), 16):
        tag, value = struct.unpack_from("<qQ", raw, i)
        if tag == 0:
            break
        tags.setdefault(tag, value)

    def pointer(tag: int) -> int | None:
        value = tags.get(tag)
        if value is None:
            return None
        # glibc relocates these in place on x86-64; a loader that does not leaves them
        # as offsets from the load address
        return value + bias if value < bias else value

    strtab, symtab = pointer(5), pointer(6)
    if strtab is None or symtab is None:
        raise ValueError("no dynamic symbol table")
    table = _SymbolTable(mem, strtab, symtab, tags.get(11, 24), bias)
    gnu, sysv = pointer(0x6FFFFEF5), pointer(4)
    out = {}
    for name in names:
        if gnu is not None:
            value = table.gnu_lookup(gnu, name)
        elif sysv is not None:
            value = table.sysv_lookup(sysv, name)
        else:
            raise ValueError("no symbol hash table")
        if value is not None:
            out[name] = value
    return out


_MAX_CHAIN = 1 << 16


class _SymbolTable:
    """Lookups in a loaded object's ``.dynsym``, by its hash tables, as ld.so does."""

    def __init__(self, mem: Memory, strtab: int, symtab: int, syment: int, bias: int) -> None:
        self.mem = mem
        self.strtab = strtab
        self.symtab = symtab
        self.syment = syment
        self.bias = bias

    def u32(self, address: int) -> int:
        return int(struct.unpack("<I", self.mem.read(address, 4))[0])

    def symbol(self, index: int, name: bytes) -> int | None:
        """The address of symbol ``index`` when it is ``name`` and defined here."""
        st_name, _, _, shndx, value, _ = struct.unpack(
            "<IBBHQQ", self.mem.read(self.symtab + index * self.syment, 24)
        )
        if shndx == 0 or value == 0:  # undefined here
            return None
        if self.mem.read(self.strtab + st_name, len(name) + 1) != name + b"\0":
            return None
        return int(self.bias + value)

    def gnu_lookup(self, table: int, name: bytes) -> int | None:
        h = 5381
        for c in name:
            h = (h * 33 + c) & 0xFFFFFFFF
        nbuckets, symoffset, bloom_size, _ = struct.unpack("<IIII", self.mem.read(table, 16))
        if nbuckets == 0:
            return None
        buckets = table + 16 + bloom_size * 8
        chains = buckets + nbuckets * 4
        index = self.u32(buckets + (h % nbuckets) * 4)
        if index < symoffset:
            return None
        for _ in range(_MAX_CHAIN):
            link = self.u32(chains + (index - symoffset) * 4)
            if (link | 1) == (h | 1):
                found = self.symbol(index, name)
                if found is not None:
                    return found
            if link & 1:
                return None
            index += 1
        return None

    def sysv_lookup(self, table: int, name: bytes) -> int | None:
        h = 0
        for c in name:
            h = ((h << 4) + c) & 0xFFFFFFFF
            g = h & 0xF0000000
            if g:
                h ^= g >> 24
            h &= ~g & 0xFFFFFFFF
        nbucket, nchain = struct.unpack("<II", self.mem.read(table, 8))
        if nbucket == 0:
            return None
        index = self.u32(table + 8 + (h % nbucket) * 4)
        for _ in range(_MAX_CHAIN):
            if index == 0 or index >= nchain:
                return None
            found = self.symbol(index, name)
            if found is not None:
                return found
            index = self.u32(table + 8 + nbucket * 4 + index * 4)
        return None


# ---- the main thread, stopped -------------------------------------------------------


class Registers:
    """A thread's general registers (``user_regs_struct``), by name."""

    def __init__(self, raw: bytes) -> None:
        self.words = list(struct.unpack(_REGS_FORMAT, raw))

    def __getitem__(self, name: str) -> int:
        return int(self.words[_REGISTER[name]])

    def but(self, **changes: int) -> Registers:
        """A copy with ``changes`` (negative values as the unsigned word)."""
        copy = Registers(self.pack())
        for name, value in changes.items():
            copy.words[_REGISTER[name]] = value & MINUS_ONE
        return copy

    def pack(self) -> bytes:
        return struct.pack(_REGS_FORMAT, *self.words)


class Held(NamedTuple):
    """A signal that stopped the traced thread, held until its registers are back."""

    signo: int
    info: bytes

    @property
    def code(self) -> int:
        return int(struct.unpack_from("<i", self.info, 8)[0])

    @property
    def name(self) -> str:
        try:
            return signal.Signals(self.signo).name
        except ValueError:
            return f"signal {self.signo}"


class _Kernel:
    """ptrace, tgkill and rt_tgsigqueueinfo through ctypes."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._ptrace = libc.ptrace
        self._ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
        self._ptrace.restype = ctypes.c_long
        self._syscall = libc.syscall
        self._syscall.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_long,
                                  ctypes.c_void_p]  # fmt: skip
        self._syscall.restype = ctypes.c_long

    def ptrace(self, request: int, pid: int, addr: int = 0, data: int = 0) -> None:
        if self._ptrace(request, pid, addr or None, data or None) == -1:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    def syscall(self, number: int, a: int, b: int, c: int, d: int = 0) -> int:
        result = int(self._syscall(number, a, b, c, d or None))
        if result == -1:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return result


class Traced:
    """The main thread of ``pid`` under ptrace, from ``PTRACE_SEIZE`` to the detach.
    Every signal that stops it on the way is held (:attr:`held`) and given back by
    :meth:`detach`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.kernel = _Kernel()
        self.held: list[Held] = []
        self.at_signal = False
        """Whether the current stop is a signal-delivery stop (a signal can be given
        back as the detach's own there; at an event stop it is queued again)."""
        self.seized = False
        self.stopped_at: float | None = None
        self.released_at: float | None = None

    # -- stops

    def stop(self) -> None:
        """Seize and stop the main thread (it stays stopped until :meth:`detach`)."""
        self.kernel.ptrace(PTRACE_SEIZE, self.pid)
        self.seized = True
        self.stopped_at = time.perf_counter()
        self.kernel.ptrace(PTRACE_INTERRUPT, self.pid)
        status = self._wait(time.monotonic() + STOP_TIMEOUT_S)
        event, sig = status >> 16, os.WSTOPSIG(status)
        if event == PTRACE_EVENT_STOP and sig != signal.SIGTRAP:
            self.at_signal = False
            raise UnsupportedError(
                f"pid {self.pid} is stopped ({signal.Signals(sig).name}, job control): "
                f"continue it (kill -CONT {self.pid}) and attach again"
            )
        self.at_signal = event == 0
        if self.at_signal:  # a signal was on its way: that stop is as good as ours
            self.held.append(Held(sig, self._siginfo()))

    def _wait(self, deadline: float) -> int:
        """The next stop's status; :class:`GoneError` when the process ended, :class:`LateError`
        after ``deadline``. Polls (no signal of our own, no sleep for the first
        :data:`SPIN_S`: a stop comes within microseconds)."""
        spin_until = time.monotonic() + SPIN_S
        while True:
            try:
                pid, status = os.waitpid(self.pid, WALL | os.WNOHANG)
            except ChildProcessError:
                raise GoneError(f"pid {self.pid} is no longer traced (it exited?)") from None
            if pid:
                if os.WIFSTOPPED(status):
                    return status
                raise GoneError(f"pid {self.pid} ended while it was stopped ({_ended(status)})")
            now = time.monotonic()
            if now > deadline:
                raise LateError()
            if now < spin_until:
                os.sched_yield()
            else:
                time.sleep(0.0005)

    def resume_until(self, request: int, trap_at: int) -> Registers:
        """Resume (``PTRACE_CONT`` or ``PTRACE_SINGLESTEP``) until the SIGTRAP at
        ``trap_at``; signals that stop the thread on the way are held and suppressed,
        a fault of the call raises :class:`FaultedError`. The registers at the trap."""
        deadline = time.monotonic() + CALL_TIMEOUT_S
        self.kernel.ptrace(request, self.pid)
        while True:
            status = self._wait(deadline)
            event, sig = status >> 16, os.WSTOPSIG(status)
            self.at_signal = event == 0
            if self.at_signal:
                regs = self.registers()
                if sig == signal.SIGTRAP and regs["rip"] == trap_at:
                    return regs
                held = Held(sig, self._siginfo())
                if sig in FAULTS and held.code > 0:
                    raise FaultedError(f"{held.name} at {regs['rip']:#x}")
                self.held.append(held)
            # a group stop (another thread took a SIGSTOP) or a late interrupt: go on
            self.kernel.ptrace(request, self.pid)

    def halt(self) -> None:
        """Stop the thread again where it is (the call did not end in time)."""
        self.kernel.ptrace(PTRACE_INTERRUPT, self.pid)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while True:
            status = self._wait(deadline)
            self.at_signal = status >> 16 == 0
            if not self.at_signal:
                return
            held = Held(os.WSTOPSIG(status), self._siginfo())
            if held.signo in FAULTS and held.code > 0:
                return  # a fault of the call: stopped there, and its state goes back
            self.held.append(held)
            self.kernel.ptrace(PTRACE_CONT, self.pid)

    # -- registers

    def registers(self) -> Registers:
        buf = ctypes.create_string_buffer(len(REGISTERS) * 8)
        self.kernel.ptrace(PTRACE_GETREGS, self.pid, 0, ctypes.addressof(buf))
        return Registers(buf.raw)

    def set_registers(self, regs: Registers) -> None:
        buf = ctypes.create_string_buffer(regs.pack(), len(REGISTERS) * 8)
        self.kernel.ptrace(PTRACE_SETREGS, self.pid, 0, ctypes.addressof(buf))

    def xstate(self) -> bytes:
        """The whole extended state, at the kernel's size for this CPU (a read into a
        larger buffer says it: ``iov_len`` comes back as the size)."""
        size = XSTATE_START
        while True:
            buf = ctypes.create_string_buffer(size)
            iov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), size)
            self.kernel.ptrace(PTRACE_GETREGSET, self.pid, NT_X86_XSTATE, ctypes.addressof(iov))
            got = int(iov[1] or 0)
            if got < size:
                return buf.raw[:got]
            size *= 4

    def set_xstate(self, data: bytes) -> None:
        """Written back at exactly the size it was read (any other size: EFAULT)."""
        buf = ctypes.create_string_buffer(data, len(data))
        iov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), len(data))
        self.kernel.ptrace(PTRACE_SETREGSET, self.pid, NT_X86_XSTATE, ctypes.addressof(iov))

    def _siginfo(self) -> bytes:
        buf = ctypes.create_string_buffer(SIGINFO_SIZE)
        self.kernel.ptrace(PTRACE_GETSIGINFO, self.pid, 0, ctypes.addressof(buf))
        return buf.raw

    # -- the way out

    def detach(self) -> None:
        """Let the thread go; the held signals are given back (see the module's doc)."""
        held = list(self.held)
        first = held.pop(0) if held and self.at_signal else None
        for h in held:
            self._queue_again(h)
        if first is not None:
            buf = ctypes.create_string_buffer(first.info, SIGINFO_SIZE)
            self.kernel.ptrace(PTRACE_SETSIGINFO, self.pid, 0, ctypes.addressof(buf))
        self.kernel.ptrace(PTRACE_DETACH, self.pid, 0, first.signo if first else 0)
        self.seized = False
        self.released_at = time.perf_counter()

    def _queue_again(self, held: Held) -> None:
        """A held signal pending again for the main thread: with its siginfo where the
        kernel lets another process queue that (``si_code`` < 0: sigqueue, timers,
        async I/O), else as the same signal sent by this process."""
        if held.code < 0 and held.code != SI_TKILL:
            buf = ctypes.create_string_buffer(held.info, SIGINFO_SIZE)
            with contextlib.suppress(OSError):
                self.kernel.syscall(
                    SYS_RT_TGSIGQUEUEINFO, self.pid, self.pid, held.signo, ctypes.addressof(buf)
                )
                return
        self.kernel.syscall(SYS_TGKILL, self.pid, self.pid, held.signo)

    @property
    def stopped_ms(self) -> float | None:
        if self.stopped_at is None or self.released_at is None:
            return None
        return round((self.released_at - self.stopped_at) * 1000.0, 3)


def _ended(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit status {os.WEXITSTATUS(status)}"


def queue_in(traced: Traced, where: Addresses, line: bytes) -> dict[str, Any]:
    """With the main thread stopped (:meth:`Traced.stop`): map a page, copy ``line``
    into it, queue it with ``Py_AddPendingCall``, put every register back, check them,
    detach. The outcome (``queued``, ``problem``, ``stopped_ms``, ...)."""
    saved = traced.registers()
    xstate = traced.xstate()
    out: dict[str, Any] = {"queued": False, "xstate_bytes": len(xstate)}
    mem = Memory(traced.pid, write=True)
    sp = ((saved["rsp"] - RED_ZONE - 128) & ~0xF) - 8  # as after a call instruction
    try:
        if not _initialized(traced, where, saved, mem, sp):
            out["reason"] = NOT_READY
            out["problem"] = (
                "the interpreter is not initialized (still starting, or exiting): nothing queued"
            )
            return _put_back(traced, saved, xstate, out)
        size = (len(line) // 4096 + 1) * 4096
        mmap = saved.but(
            rip=where.syscall, rax=SYS_MMAP, rdi=0, rsi=size, rdx=0x3, r10=0x22, r8=-1, r9=0,
            orig_rax=-1, eflags=saved["eflags"] & ~(TF | DF),
        )  # fmt: skip
        traced.set_registers(mmap)
        page = _signed(traced.resume_until(PTRACE_SINGLESTEP, where.syscall + 2)["rax"])
        if -4096 < page < 0:
            out["problem"] = f"mmap failed in the trainer ({os.strerror(-page)}): nothing queued"
        else:
            mem.write(page, line + b"\0")
            mem.write(sp, struct.pack("<Q", where.trap))
            call = saved.but(
                rip=where.add_pending_call, rdi=where.run_simple_string, rsi=page, rax=0,
                rsp=sp, orig_rax=-1, eflags=saved["eflags"] & ~(TF | DF),
            )  # fmt: skip
            traced.set_registers(call)
            returned = ctypes.c_int(traced.resume_until(PTRACE_CONT, where.trap + 1)["rax"]).value
            out["page"] = page
            if returned == 0:
                out["queued"] = True
            else:
                out["problem"] = f"Py_AddPendingCall returned {returned} (its queue is full?)"
    except FaultedError as e:
        out["problem"] = f"the call faulted in the trainer ({e}): nothing queued"
    except LateError:
        out["problem"] = (
            f"the call did not return within {CALL_TIMEOUT_S:.0f} s (the interpreter's "
            "pending-call lock is held?): nothing queued"
        )
        traced.halt()
    except OSError as e:  # the thread is still stopped: its state goes back all the same
        out["problem"] = f"the injection failed in the middle ({e}): nothing queued"
    finally:
        mem.close()
    return _put_back(traced, saved, xstate, out)


def _initialized(traced: Traced, where: Addresses, saved: Registers, mem: Memory, sp: int) -> bool:
    """``Py_IsInitialized()`` called in the stopped thread (it reads one field of the
    runtime, takes no lock). A fault there (libpython not yet relocated, in the
    dynamic linker) is not ready either."""
    mem.write(sp, struct.pack("<Q", where.trap))
    call = saved.but(
        rip=where.is_initialized, rax=0, rsp=sp, orig_rax=-1,
        eflags=saved["eflags"] & ~(TF | DF),
    )  # fmt: skip
    traced.set_registers(call)
    try:
        regs = traced.resume_until(PTRACE_CONT, where.trap + 1)
    except FaultedError:
        return False
    return ctypes.c_int(regs["rax"] & 0xFFFFFFFF).value != 0


def _put_back(
    traced: Traced, saved: Registers, xstate: bytes, out: dict[str, Any]
) -> dict[str, Any]:
    """Every register as it was, checked, and the thread let go."""
    try:
        traced.set_xstate(xstate)
    except OSError as e:  # the general registers go back all the same: orig_rax above all
        out["restore_problem"] = f"the extended register state was not written back: {e}"
    traced.set_registers(saved)
    same = traced.xstate() == xstate and traced.registers().words == saved.words
    out["restored"] = "verified" if same else "differs"  # never seen; said, not hidden
    out["signals"] = [h.name for h in traced.held]
    traced.detach()
    out["stopped_ms"] = traced.stopped_ms
    return out


def _signed(word: int) -> int:
    return word - (1 << 64) if word >= 1 << 63 else word


def inject(pid: int, line: bytes, libpython: str | None) -> dict[str, Any]:
    """Queue ``line`` into ``pid``'s interpreter, in this process (see :func:`queue_line`
    for the way the agent calls it). An interpreter still starting is tried again for
    up to :data:`READY_WAIT_S`. Never raises: the outcome says what happened."""
    deadline = time.monotonic() + READY_WAIT_S
    tries = 0
    while True:
        tries += 1
        out = _inject_once(pid, line, libpython)
        starting = out.get("reason") == NOT_READY or (
            out.get("reason") is None and not out.get("queued") and _age_s(pid) < READY_WAIT_S
        )
        if not starting or time.monotonic() + READY_RETRY_S > deadline:
            if tries > 1:
                out["tries"] = tries
            return out
        time.sleep(READY_RETRY_S)


def _age_s(pid: int) -> float:
    """How long ago ``pid`` started (inf when unknown)."""
    stat = read_text(f"/proc/{pid}/stat") or ""
    uptime = read_text("/proc/uptime") or ""
    try:
        started = int(stat.rpartition(")")[2].split()[19]) / os.sysconf("SC_CLK_TCK")
        return float(uptime.split()[0]) - started
    except (IndexError, ValueError, OSError):
        return float("inf")


def _inject_once(pid: int, line: bytes, libpython: str | None) -> dict[str, Any]:
    try:
        where = locate(pid, libpython)
    except UnsupportedError as e:
        if _state(pid) in ("?", "Z", "X"):
            return {"queued": False, "reason": "gone", "problem": f"no process {pid} (it exited?)"}
        return {"queued": False, "problem": str(e)}
    traced = Traced(pid)
    try:
        traced.stop()
        return queue_in(traced, where, line)
    except OSError as e:
        return _refused(pid, e, traced)
    except GoneError as e:
        return {"queued": False, "reason": "gone", "problem": str(e)}
    except UnsupportedError as e:
        return {"queued": False, "problem": f"{e}: nothing was done"}
    except LateError:
        return {
            "queued": False,
            "problem": f"pid {pid}'s main thread did not stop within {STOP_TIMEOUT_S:.0f} s "
            f"(state {_state(pid)}: uninterruptible, e.g. inside a driver call): nothing was "
            "done; try again",
        }
    finally:
        if traced.seized:
            with contextlib.suppress(OSError):
                traced.detach()


def _refused(pid: int, e: OSError, traced: Traced) -> dict[str, Any]:
    if traced.seized:  # after the seize: the injection itself failed
        return {"queued": False, "problem": f"ptrace failed in the middle of the injection: {e}"}
    if e.errno == 3:  # ESRCH
        return {"queued": False, "reason": "gone", "problem": f"no process {pid} (it exited?)"}
    other = tracer(pid)
    if other:
        return {
            "queued": False,
            "reason": "permission",
            "problem": f"pid {pid} is traced by pid {other} already (a debugger, strace, "
            "py-spy): a process has one tracer at a time",
        }
    return {
        "queued": False,
        "reason": "permission",
        "problem": f"ptrace was refused ({e.strerror}){container_hint()}",
    }


def _state(pid: int) -> str:
    stat = read_text(f"/proc/{pid}/stat") or ""
    return stat.rpartition(")")[2].split()[0] if ")" in stat else "?"


def queue_line(pid: int, line: bytes, libpython: str | None) -> dict[str, Any]:
    """:func:`inject` in a forked child, which does nothing else and exits: should it
    die, its exit detaches the trainer. The outcome, with ``tool_s`` (the whole
    call, fork included)."""
    t0 = time.monotonic()
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        os.close(read_end)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl+C waits the milliseconds out
        try:
            outcome = inject(pid, line, libpython)
        except BaseException as e:
            outcome = {"queued": False, "problem": f"the injector failed: {type(e).__name__}: {e}"}
        try:
            os.write(write_end, json.dumps(outcome).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    data = b""
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([read_end], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(read_end)
    done = False
    if not data:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)  # its exit detaches the trainer
        done = True
    os.waitpid(child, 0)
    try:
        out: dict[str, Any] = parse_json(data) if data else {}
    except ValueError:
        out = {}
    if not out:
        out = {
            "queued": False,
            "problem": "the injector did not answer"
            + (f" within {CHILD_TIMEOUT_S:.0f} s (stopped)" if done else ""),
        }
    out["tool_s"] = round(time.monotonic() - t0, 4)
    return out
