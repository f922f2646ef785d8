"""The claims records' C decoder (queue_worker/protocol/_cdecode.c), built by the build backend with
the rest of the install.

It is optional: where no C compiler (or no Python or zlib headers) is found, setuptools says
so once, in the build's output, and the install goes on; qw then runs the Python the
decoder copies (queue_worker.protocol.cdecode loads it only if it was built). The metadata is in
pyproject.toml.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        # the claims records' decoder (queue_worker/protocol/records.py, claims_span.py,
        # log_reading.py)
        Extension(
            "queue_worker.protocol._cdecode",
            ["queue_worker/protocol/_cdecode.c"],
            libraries=["z"],
            optional=True,
        ),
    ]
)
