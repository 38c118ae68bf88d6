"""An operating-system sandbox for one submission's grading run, made with bubblewrap.

``icl-course grade`` runs each submission's ``nbgrader autograde`` (and so the learner's kernel)
inside :func:`sandboxed`, which gives it, by construction rather than by a list of known attacks:

* **no capability, whoever starts the grader**: its own user namespace, in which it runs as the
  unprivileged ``nobody`` with every capability dropped (``--unshare-user --uid 65534 --cap-drop ALL``).
  Started as root, the grader still gives the learner's code no way to ``mount``, ``umount`` or
  remount: the read-only folders stay read-only and the hidden ones hidden.  Outside the namespace
  it acts as the grader's user *without* that user's capabilities, so it cannot leave its control
  group (``/sys`` is not mounted) or pass a permission check that only root's capabilities pass;
* **its own PID namespace**: it cannot see or signal the grader, other submissions or any other
  process, and when its first process ends the kernel ends every process left in the namespace
  (a process that detached with ``setsid`` included); ``--die-with-parent`` ends it with the grader;
* **its own network namespace**, with nothing but a loopback device: no network;
* **a private file system**: the operating system's programs and libraries and the Python
  environment are mounted read-only; the submission's own course folder is the only writable
  place, with its ``source/`` folder (the answer keys) hidden; ``/tmp`` and ``HOME`` are empty and
  discarded at the end.  ``--out`` with the grading secret, the answer keys, the submissions folder,
  the rest of the course's repository (``solutions/``, ``chapters/``, ``tests/``) and other students'
  folders are simply not there;
* **no answers in the package**: in place of the ``icl_course`` package folder (and of any other
  installed copy in the mounted Python folders) it mounts, read-only and at the same path, a copy
  made by :func:`icl_course.grading.stripped.strip_package` in which the reference functions of the
  tasks being graded raise an error instead of answering, whether they are imported, read with
  ``inspect.getsource`` or opened as files.  The kernel draws no grading inputs itself: the
  grader writes them beforehand (:func:`icl_course.grading.protocol.write_cases`), so it needs
  neither the seed nor the case generators that call those references.

**One memory limit and one process-count limit for the whole submission** come from a Linux control
group (:class:`ControlGroup`): the grader makes one per submission where it may (as root, or where
the service manager delegated the memory and pids controllers), puts the sandbox in it, and kills
and removes it afterwards; the kernel's out-of-memory killer then stops the submission as a whole,
however many processes it started.  Where no control group can be made, grading says so and keeps
only the per-process limits (address space, file size).  ``/tmp`` inside the sandbox is a memory
file system, and so, with a control group, is the submission's course folder
(:func:`memory_file_system`): what a submission writes anywhere counts against its one memory limit,
which is thus also its disk limit.  Without a control group the course folder is on disk and only
each file is capped (at the memory limit).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["SandboxUnavailable", "sandbox_problem", "sandboxed", "package_folder", "ControlGroup", "SANDBOX_ID"]

# the user and group the sandboxed command runs as, inside its own user namespace (``nobody``); the
# grader's own user outside maps to it, so the command can write only where the grader could and holds
# no capability anywhere
SANDBOX_ID = 65534
# the operating system's own read-only parts; those that do not exist are skipped
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")


class ControlGroup:
    """A Linux control group that holds one submission: one memory limit and one process-count limit
    for all its processes together.

    :meth:`create` returns None, with the reason in ``ControlGroup.problem``, where this process may
    not make one (cgroup v2 or v1, memory and pids controllers, write access to its own group).
    Use: ``group.enter`` as the child's ``preexec_fn`` (it moves the child, before it runs the
    sandbox, into the group), then ``group.close()`` kills whatever is left and removes the group.
    """

    problem = ""

    def __init__(self, folders: list[Path], version: int):
        self.folders, self.version = folders, version

    @staticmethod
    def _own_groups() -> dict[str, str]:
        groups = {}
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                groups[controller] = path
        return groups

    @classmethod
    def create(cls, name: str, memory_bytes: int, max_processes: int) -> "ControlGroup | None":
        root = Path("/sys/fs/cgroup")
        try:
            own = cls._own_groups()
        except OSError as error:
            cls.problem = f"cannot read /proc/self/cgroup ({error})"
            return None
        folders = []
        try:
            if (root / "cgroup.controllers").exists():   # cgroup v2, one tree
                parent = root / own.get("", "/").lstrip("/")
                available = (parent / "cgroup.subtree_control").read_text().split()
                if not {"memory", "pids"} <= set(available):
                    cls.problem = f"the memory and pids controllers are not delegated to {parent}"
                    return None
                folder = parent / name
                folder.mkdir()
                folders.append(folder)
                (folder / "memory.max").write_text(str(memory_bytes))
                if (folder / "memory.swap.max").exists():   # no swapping out of the limit
                    (folder / "memory.swap.max").write_text("0")
                (folder / "pids.max").write_text(str(max_processes))
                return cls(folders, 2)
            for controller, limits in (("memory", {"memory.limit_in_bytes": memory_bytes}),
                                       ("pids", {"pids.max": max_processes})):
                base = root / controller
                if not base.is_dir():
                    raise OSError(f"no {controller} controller under {root}")
                folder = base / own.get(controller, "/").lstrip("/") / name
                folder.mkdir()
                folders.append(folder)
                for file, value in limits.items():
                    (folder / file).write_text(str(value))
            return cls(folders, 1)
        except OSError as error:
            cls.problem = f"no control group could be made ({error.strerror or error})"
            for folder in reversed(folders):
                try:
                    folder.rmdir()
                except OSError:
                    pass
            return None

    def enter(self) -> None:
        """Move the calling process into the group (in a child, before it runs the sandbox)."""
        for folder in self.folders:
            (folder / "cgroup.procs").write_text(str(os.getpid()))

    def processes(self) -> list[int]:
        found = set()
        for folder in self.folders:
            try:
                found.update(int(line) for line in (folder / "cgroup.procs").read_text().split())
            except OSError:
                pass
        return sorted(found)

    def out_of_memory(self) -> bool:
        """Whether the memory limit stopped a process of the group."""
        folder = self.folders[0]
        try:
            if self.version == 2:
                events = dict(line.split() for line in (folder / "memory.events").read_text().splitlines())
                return int(events.get("oom_kill", 0)) > 0
            # v1: a kill by the out-of-memory killer, not merely reaching the limit (failcnt counts that)
            control = dict(line.split() for line in (folder / "memory.oom_control").read_text().splitlines())
            return int(control.get("oom_kill", 0)) > 0
        except (OSError, ValueError):
            return False

    def out_of_processes(self) -> bool:
        """Whether a process of the group was refused because the group had its maximum."""
        folder = self.folders[-1] if self.version == 1 else self.folders[0]
        try:
            events = dict(line.split() for line in (folder / "pids.events").read_text().splitlines())
            return int(events.get("max", 0)) > 0
        except (OSError, ValueError):
            return False

    def close(self) -> None:
        """Kill every process left in the group, then remove it."""
        import signal
        import time
        for _ in range(50):
            left = self.processes()
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.05)
        for folder in reversed(self.folders):
            try:
                folder.rmdir()
            except OSError:
                pass


def memory_file_system() -> Path | None:
    """A writable memory file system (``/dev/shm`` where it is a tmpfs), or None.

    A submission's course folder lives there when a control group holds the submission: every byte
    its processes write is then a page of memory charged to that group, so the memory limit is also
    the submission's disk limit, for all its files together, and nothing it writes reaches the disk.
    """
    candidate = Path("/dev/shm")
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    if any(line.split()[1:3] == [str(candidate), "tmpfs"] for line in mounts if len(line.split()) > 2) \
            and os.access(candidate, os.W_OK | os.X_OK):
        return candidate
    return None


class SandboxUnavailable(RuntimeError):
    """No sandbox can be made on this machine; the message says why and what to do."""


def _bubblewrap() -> str | None:
    return shutil.which("bwrap")


def sandbox_problem() -> str | None:
    """Why no sandbox can be made here, or None when one can (it is tried once for real)."""
    if sys.platform != "linux":
        return f"the sandbox needs Linux namespaces; this is {sys.platform}"
    program = _bubblewrap()
    if program is None:
        return "bubblewrap (the `bwrap` program) is not installed: apt-get install bubblewrap"
    try:
        result = subprocess.run(sandboxed(["true"], writable=None, program=program), capture_output=True,
                                text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"bubblewrap could not start: {error}"
    if result.returncode != 0:
        return ("bubblewrap cannot create namespaces here (user namespaces may be disabled): "
                f"{(result.stderr or result.stdout).strip()[:200]}")
    return None


def package_folder() -> Path:
    """The folder of the ``icl_course`` that this process imports: the one the sandbox mounts."""
    spec = importlib.util.find_spec("icl_course")
    return Path(spec.origin).resolve().parent


def _python_folders() -> list[Path]:
    folders = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), Path(sys.exec_prefix).resolve(),
               Path(sys.executable).resolve().parent}
    for entry in sys.path:
        path = Path(entry or ".").resolve()
        if path.is_dir() and ("site-packages" in path.parts or "dist-packages" in path.parts):
            folders.add(path)
    return sorted(folders)


def _installed_copies(package: Path) -> list[Path]:
    """Other ``icl_course`` folders in the mounted Python folders (a regular, non-editable install)."""
    copies = {(folder / "icl_course").resolve() for folder in _python_folders() if (folder / "icl_course").is_dir()}
    return sorted(copies - {package})


def sandboxed(command: list[str], writable: Path | None, hidden: tuple = (), program: str | None = None,
              environment: dict | None = None, package: Path | None = None) -> list[str]:
    """The bubblewrap command line that runs ``command`` in the sandbox described above.

    ``writable`` is bound read-write at its own path and is the working directory; ``hidden``
    folders inside it are covered by an empty file system; ``environment`` is the whole
    environment the command sees.  ``package``, a copy of the package made by
    :func:`icl_course.grading.stripped.strip_package`, is mounted in place of the real package
    folder and of any other installed copy of it, so that only the copy can be read.
    """
    arguments = [program or _bubblewrap() or "bwrap", "--die-with-parent", "--new-session",
                 # a user namespace of its own in which the command is an ordinary user with no capability,
                 # whoever starts the grader (root included): it cannot mount, unmount or remount anything,
                 # so the read-only and hidden folders below stay so
                 "--unshare-user", "--uid", str(SANDBOX_ID), "--gid", str(SANDBOX_ID), "--cap-drop", "ALL",
                 "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--hostname", "sandbox",
                 "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--dir", "/tmp/home", "--tmpfs", "/run",
                 "--clearenv"]
    for path in SYSTEM_PATHS:
        if os.path.islink(path):
            arguments += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            arguments += ["--ro-bind", path, path]
    real = package_folder()
    for folder in _python_folders() + [real]:
        if not any(str(folder).startswith(system + "/") for system in SYSTEM_PATHS):
            arguments += ["--ro-bind", str(folder), str(folder)]
    if package is not None:   # mounted last, over the folders above: every path to the package shows the copy
        for folder in [real] + _installed_copies(real):
            arguments += ["--ro-bind", str(Path(package).resolve()), str(folder)]
    if writable is not None:
        writable = Path(writable).resolve()
        arguments += ["--bind", str(writable), str(writable)]
        for folder in hidden:
            arguments += ["--tmpfs", str(writable / folder)]
        arguments += ["--chdir", str(writable)]
    home = {"HOME": "/tmp/home", "JUPYTER_RUNTIME_DIR": "/tmp/runtime", "IPYTHONDIR": "/tmp/ipython",
            "MPLCONFIGDIR": "/tmp/matplotlib", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
            # the kernel imports the icl_course mounted above, the grader's own, rather than whatever an
            # editable install's finder points at (another checkout, which is not mounted)
            "PYTHONPATH": str(package_folder().parent)}
    for name, value in {**home, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), **(environment or {})}.items():
        arguments += ["--setenv", name, value]
    return arguments + ["--", *command]
