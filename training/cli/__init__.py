"""The ``python -m training <command>`` command lines, one module per command (see :mod:`training.__main__`)."""
