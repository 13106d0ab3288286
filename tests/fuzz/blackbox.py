"""blackbox.py: what cli_fuzz.py and serve_fuzz.py share: their command line, a scratch folder and the model."""
import os
import random
import subprocess
import sys
import tempfile


def setup(doc, default_n, name):
    """DJINN CONVERT DATA [N] [SEED] from sys.argv (else doc and exit): (djinn, convert, data, n, rng, scratch)."""
    if len(sys.argv) < 4:
        sys.exit(doc)
    dj, conv, data = sys.argv[1:4]
    n = int(sys.argv[4]) if len(sys.argv) > 4 else default_n
    rng = random.Random(int(sys.argv[5]) if len(sys.argv) > 5 else 1)
    return dj, conv, data, n, rng, tempfile.mkdtemp(prefix=f"djinn_{name}.")


def stories(conv, data, folder, dtype):
    """stories260K from DATA converted to dtype in folder: its path."""
    out = os.path.join(folder, f"stories_{dtype}.bin")
    subprocess.run([conv, os.path.join(data, "models", "stories260K"), out, "--dtype", dtype, "-q"], check=True)
    return out
