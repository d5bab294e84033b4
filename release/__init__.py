"""release: builds, verifies, documents and publishes quantized Cosmos3 checkpoints."""

from pathlib import Path

__version__ = "0.1.0"

# The card templates, the catalogs and the default build files: inside an installed wheel they sit in the package
# (``setup.py`` copies the checkout's top-level folders there when it builds one); in a checkout or an editable
# install, the checkout's own folders are used.
PACKAGE_DATA = Path(__file__).resolve().parent / "_data"
CHECKOUT = Path(__file__).resolve().parent.parent


def data_path(name: str) -> Path:
    """``templates``, ``locales`` or ``builds``: the wheel's copy, else the checkout's."""
    packaged = PACKAGE_DATA / name
    return packaged if packaged.is_dir() else CHECKOUT / name


class ReleaseError(Exception):
    """Root of every error the tool reports to a user.

    The message is one line that names the file, field or tensor at fault and says how to fix it;
    the CLI prints it and exits with ``exit_code`` (2: bad input).
    """

    exit_code = 2


class GateError(ReleaseError):
    """A build that failed verification or a gate: the input is valid, the result is not acceptable."""

    exit_code = 1
