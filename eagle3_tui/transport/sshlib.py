"""asyncssh, imported without the warnings its import prints under cryptography 51+.

cryptography 51 deprecates DSA, and asyncssh 2.24 names DSA's types when its modules
load: ten lines of ``CryptographyDeprecationWarning`` on stderr before the first word
of every command that reaches a host (a command's one-line error among them). No
eagle3-tui connection offers or takes a DSA key (OpenSSH dropped DSA in 9.8), so those
warnings tell its user nothing: they are silenced here, during the import alone, and
nothing else is. Every module that needs asyncssh imports it from here.
"""

from __future__ import annotations

import warnings

with warnings.catch_warnings():
    try:
        from cryptography.utils import CryptographyDeprecationWarning
    except ImportError:  # pragma: no cover (asyncssh requires cryptography)
        pass
    else:
        warnings.simplefilter("ignore", CryptographyDeprecationWarning)
    import asyncssh

__all__ = ["asyncssh"]
