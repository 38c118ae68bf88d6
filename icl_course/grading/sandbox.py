"""An operating-system sandbox for one submission's grading run, made with bubblewrap.

``icl-course grade`` runs each submission's ``nbgrader autograde`` (and so the learner's kernel)
inside :func:`sandboxed`, which gives it, by construction rather than by a list of known attacks:

* **its own PID namespace**: it cannot see or signal the grader, other submissions or any other
  process, and when its first process ends the kernel ends every process left in the namespace
  (a process that detached with ``setsid`` included); ``--die-with-parent`` ends it with the grader;
* **its own network namespace**, with nothing but a loopback device: no network;
* **a private file system**: the operating system's programs and libraries, the Python
  environment and the ``icl_course`` package are mounted read-only; the submission's own course
  folder is the only writable place, with its ``source/`` folder (the answer keys) hidden; ``/tmp``
  and ``HOME`` are empty and discarded at the end.  ``--out`` with the grading secret, the answer
  keys, the submissions folder and other students' folders are simply not there.

What it does not give (see the README's threat model): one memory, process-count and disk limit
for the whole submission needs control groups, which most machines reserve for their service
manager.  The grader keeps its per-process limits (address space, processes, file size) inside the
sandbox as a second line.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["SandboxUnavailable", "sandbox_problem", "sandboxed"]

# the operating system's own read-only parts; those that do not exist are skipped
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")


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


def _package_folder() -> Path:
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


def sandboxed(command: list[str], writable: Path | None, hidden: tuple = (), program: str | None = None,
              environment: dict | None = None) -> list[str]:
    """The bubblewrap command line that runs ``command`` in the sandbox described above.

    ``writable`` is bound read-write at its own path and is the working directory; ``hidden``
    folders inside it are covered by an empty file system; ``environment`` is the whole
    environment the command sees.
    """
    arguments = [program or _bubblewrap() or "bwrap", "--die-with-parent", "--new-session",
                 "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--hostname", "sandbox",
                 "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--dir", "/tmp/home", "--tmpfs", "/run",
                 "--clearenv"]
    for path in SYSTEM_PATHS:
        if os.path.islink(path):
            arguments += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            arguments += ["--ro-bind", path, path]
    for folder in _python_folders() + [_package_folder()]:
        if not any(str(folder).startswith(system + "/") for system in SYSTEM_PATHS):
            arguments += ["--ro-bind", str(folder), str(folder)]
    if writable is not None:
        writable = Path(writable).resolve()
        arguments += ["--bind", str(writable), str(writable)]
        for folder in hidden:
            arguments += ["--tmpfs", str(writable / folder)]
        arguments += ["--chdir", str(writable)]
    home = {"HOME": "/tmp/home", "JUPYTER_RUNTIME_DIR": "/tmp/runtime", "IPYTHONDIR": "/tmp/ipython",
            "MPLCONFIGDIR": "/tmp/matplotlib", "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
    for name, value in {**home, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), **(environment or {})}.items():
        arguments += ["--setenv", name, value]
    return arguments + ["--", *command]
