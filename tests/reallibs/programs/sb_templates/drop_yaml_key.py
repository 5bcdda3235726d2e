"""Setup step: comment out a top-level key of a hyperpyyaml file (python drop_yaml_key.py FILE
KEY). SpeechBrain's speaker-id template moves its feature model to "cuda" whenever its
train.yaml has `feats_cache_dir` (to fill an HDF5 feature cache); the CPU run drops the key."""

import re
import sys

path, key = sys.argv[1:3]
with open(path, encoding="utf-8") as f:
    text = f.read()
text, count = re.subn(rf"(?m)^{re.escape(key)}:", f"# {key}:", text)
assert count, f"{path} has no top-level {key}"
with open(path, "w", encoding="utf-8") as f:
    f.write(text)
