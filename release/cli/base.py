"""What every ``release`` command shares: the group that turns errors into one line, ``-q``, ``--builds`` before or
after the command's name, the common options and the help's environment list."""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from release.core.errors import ReleaseError
from release.core.redact import scrub

DEBUG_ENV = "RELEASE_DEBUG"
# What the system refuses to a file the user named or a folder it is in (a read-only file system, permissions): the
# user's to fix, said in one line; every output is written aside and put in place whole, so nothing is half-written.
REFUSED_WRITES = (errno.EROFS, errno.EACCES, errno.EPERM)
# a file where a folder must go (RELEASE_CACHE set to a file, or under one)
BLOCKED_PATHS = (errno.ENOTDIR, errno.EEXIST)


class _Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a job scheduler, torchrun stopping the other ranks) ends a command as Ctrl-C does: what it
    was writing is removed, its outputs are left whole and ``RELEASE_PROFILE`` keeps what ran."""


def _say(line: str) -> None:
    """An error line on stderr, built from an exception: scrubbed of the token and authorization values (a library's
    error may quote its request's headers)."""
    click.echo(scrub(line), err=True)


def _terminate(signum: int, frame: Any) -> None:
    raise _Terminated


def _quiet(ctx: click.Context, param: click.Parameter, quiet: bool) -> None:
    """``release -q`` sets quiet mode for the command it runs (and clears it: one process may run several); a
    command's own ``-q`` turns it on."""
    from release.core.output import set_quiet

    if quiet or ctx.parent is None:
        set_quiet(quiet)


class _Command(click.Command):
    """``release`` and each of its commands take ``-q``, as pip takes ``pip -q install`` and ``pip install -q``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.append(click.Option(["-q", "--quiet"], is_flag=True, expose_value=False, callback=_quiet,
                                        help="No progress bars or informational lines on stderr; the result, "
                                        "warnings and errors stay."))


class _Commands(click.Group):
    """A group of ``release`` commands (``release observations``)."""

    command_class = _Command


class ReleaseGroup(_Command, _Commands):
    """Turns every error into one line on stderr; tracebacks only with ``RELEASE_DEBUG=1``."""

    group_class = _Commands

    def invoke(self, ctx: click.Context) -> Any:
        from release.core import profile
        from release.core.distributed import world

        main_thread = threading.current_thread() is threading.main_thread()  # where signals are delivered
        previous = signal.getsignal(signal.SIGTERM)
        if main_thread:
            signal.signal(signal.SIGTERM, _terminate)
        try:
            result = super().invoke(ctx)
        except ReleaseError as exc:
            if os.environ.get(DEBUG_ENV) == "1":
                raise
            _say(f"error: {exc}")
            sys.exit(exc.exit_code)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except KeyboardInterrupt as exc:
            click.echo("interrupted; outputs were left untouched, rerun to resume", err=True)
            sys.exit(128 + signal.SIGTERM if isinstance(exc, _Terminated) else 130)
        except Exception as exc:  # a bug, not bad input: say so, keep the traceback for RELEASE_DEBUG=1
            if os.environ.get(DEBUG_ENV) == "1":
                raise
            if isinstance(exc, OSError) and exc.errno in REFUSED_WRITES and exc.filename:
                _say(f"error: {exc.filename}: {exc.strerror}; make it writable or choose another folder (nothing "
                     "was replaced)")
                sys.exit(2)
            if isinstance(exc, OSError) and exc.errno in BLOCKED_PATHS and exc.filename:
                _say(f"error: {exc.filename}: {exc.strerror}: a file stands where a folder must go (check "
                     "RELEASE_CACHE and the paths given); choose another folder (nothing was replaced)")
                sys.exit(2)
            if type(exc).__name__ == "OutOfMemoryError":  # torch's: too little GPU memory, not a bug
                from release.core.memory import out_of_memory

                click.echo(f"error: {out_of_memory()}", err=True)
                sys.exit(2)
            _say(f"internal error: {type(exc).__name__}: {exc} (rerun with {DEBUG_ENV}=1 for a traceback)")
            sys.exit(1)
        finally:
            profile.report(str(ctx.invoked_subcommand), world().rank)
            if main_thread:
                signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        if ctx.invoked_subcommand in USES_BUILDS and world().main:  # after the work: an error stays one line
            from release.core.config import builds_source
            from release.core.output import info

            where, why = builds_source()
            info(f"build files: {where} ({why})")
        return result

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        from release.core import config

        config.BUILDS_OPTION.clear()  # one process may run several commands (tests, notebooks)
        return super().parse_args(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Each command's first sentence whole, wrapped by the formatter (click cuts it at the width with '...')."""
        rows = [(name, command.get_short_help_str(limit=10_000)) for name in self.list_commands(ctx)
                if (command := self.get_command(ctx, name)) is not None and not command.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


ENVIRONMENT = """\b
Environment:
  RELEASE_BUILDS        folder of build files when --builds is not given (then ./builds, then the
                        shipped defaults)
  RELEASE_SOURCE        BF16 source (a folder or a Hub id in the local cache) when --source is not
                        given (then the cache at base_model / base_revision)
  RELEASE_OBSERVATIONS  observation set when --observations is not given
  RELEASE_CACHE         calibration captures, rollouts, VAE encodes, hashes, torch.compile's caches
                        (default .cache/release; TORCHINDUCTOR_CACHE_DIR, where set, for the last)
  RELEASE_DEVICE        auto (default: CUDA when present), cpu or cuda
  RELEASE_CUDA_GRAPHS   0: eval's rollouts run eager on CUDA (default 1: BF16, the fake-quant replay and
                        the deployed FP8 build replay their decoder stacks as CUDA graphs, the same bits)
  RELEASE_DEBUG=1       tracebacks instead of one-line errors
  RELEASE_PROFILE=FILE  the time and peak GPU memory of each stage, written to FILE as JSON (and printed)
  RELEASE_MAX_GPU_MEMORY=SIZE
                        build, verify and eval keep GPU memory within SIZE (as --max-gpu-memory)
  WORLD_SIZE, RANK, LOCAL_RANK
                        set by torchrun: build, verify and eval split their work across the processes
  RELEASE_DIST_TIMEOUT  under torchrun: seconds a rank waits for the others' shares (default 86400)
  SOURCE_DATE_EPOCH     pins the date recorded in provenance.json, selection.json and tables.json
  HF_TOKEN              the Hub token for push (else the huggingface_hub login); never printed
  RELEASE_HUB_TIMEOUT   push: seconds a Hub request waits to connect or for more of an answer
                        (default 60)
  RELEASE_HUB_DEADLINE  push: seconds the plan of a repo may take, all its requests together
                        (default 300)
  HF_ENDPOINT, HF_HOME, HF_HUB_OFFLINE
                        read by huggingface_hub (the endpoint, the cache, offline mode)
"""
# The release's folder, as every command takes it ('release build' writes it).
DIST = click.option("--dist", type=click.Path(path_type=Path), default=Path("dist"), show_default=True,
                    help="The release's folder: a folder per build repo (what 'release build' wrote), tables/ "
                    "and selection.json.")
OBSERVATIONS = click.option("--observations", type=click.Path(path_type=Path), default=None,
                            help="Observation set (default: $RELEASE_OBSERVATIONS, then 'observations' beside the "
                            "source).")
# Commands that read build files say which folder they read.
USES_BUILDS = {"build", "verify", "eval", "import-served", "tables", "select", "card", "push", "observations",
               "manifest", "campaign"}
SOURCE = click.option("--source", default=None, help="BF16 checkpoint: a folder, or a Hub id org/name[@revision] in "
                      "the local Hugging Face cache (default: $RELEASE_SOURCE, then base_model at base_revision in the "
                      "cache).")
ALLOW_REVISION_MISMATCH = click.option("--allow-revision-mismatch", is_flag=True, help="Build from a source whose Hub "
                                       "commit is not the base_revision of release.yaml (provenance and cards say so).")
BASELINE = click.option("--baseline", default="rtn", show_default=True, help="The build the others are compared with.")
FORMAT = click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
                      help="json: the result as one JSON document on stdout (its keys sorted), nothing else there.")
RESAMPLES = click.option("--resamples", type=click.IntRange(100, 1_000_000), default=10_000, show_default=True,
                         help="Bootstrap and sign-flip resamples of the tables.")


def _use_builds(ctx: click.Context, param: click.Parameter, builds: Path | None) -> None:
    """``--builds DIR``, before or after the command's name (as ``hf`` and pip take their global options): the
    folder of build files for the process; given in both places, the later one counts. Checked where the build files
    are read (``builds_source``), so that a bad folder is a one-line error."""
    from release.core import config

    if builds is not None:
        config.BUILDS_OPTION.append(builds)


BUILDS = click.option("--builds", type=click.Path(path_type=Path, file_okay=False), default=None, expose_value=False,
                      callback=_use_builds, help="Folder of build files (release.yaml and one file per build).")


EXECUTOR = click.option(
    "--executor", type=click.Choice(["local", "processes", "slurm"]), default="local", show_default=True,
    help="Where the builds run: in this process; or each build as a submitit job, on SLURM ('slurm', release.yaml's "
    "executor section) or as processes of this machine ('processes'), after one job for what they share (the "
    "capture, the BF16 reference rollouts and yardsticks). The campaign's selection, chosen builds' evaluations and "
    "cards run here.")


def quiet_libraries() -> None:
    import logging
    import warnings

    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    for name in ("diffusers", "transformers", "modelopt", "accelerate", "huggingface_hub"):
        logging.getLogger(name).setLevel(logging.ERROR)


def max_gpu_memory_option(command: Callable[..., None]) -> Callable[..., None]:
    """``--max-gpu-memory``: the GPU memory cap of the command's stages (release.core.memory)."""
    return click.option("--max-gpu-memory", default=None, metavar="SIZE",
                        help="Keep GPU memory within SIZE (e.g. 22GiB): layers that do not fit are streamed from CPU "
                        "memory, with the same results (default: $RELEASE_MAX_GPU_MEMORY, else no cap).")(command)
