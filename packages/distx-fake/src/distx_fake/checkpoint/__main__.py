"""``python -m distx_fake.checkpoint export SRC DST [--max-shard-size 5GB] [--prefix model.]``."""

from __future__ import annotations

import argparse
import sys

from ._safetensors import export_safetensors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m distx_fake.checkpoint", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    exp = sub.add_parser("export", help="export a checkpoint to a Hugging Face safetensors folder")
    exp.add_argument("src", help="checkpoint folder (save_state_dict, or dcp.save with distx_fake's writer)")
    exp.add_argument("dst", help="output folder (model-0000k-of-0000n.safetensors + model.safetensors.index.json)")
    exp.add_argument("--max-shard-size", default="5GB", help="largest file, e.g. 5GB, 500MB, 2GiB (default 5GB)")
    exp.add_argument("--prefix", default="", help="export only tensors named PREFIX..., without it (e.g. model.)")
    args = parser.parse_args(argv)
    try:
        index = export_safetensors(args.src, args.dst, max_shard_size=args.max_shard_size, prefix=args.prefix)
    except (OSError, ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    files = sorted(set(index["weight_map"].values()))
    print(f"wrote {len(index['weight_map'])} tensors, {index['metadata']['total_size']} bytes, in {len(files)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
