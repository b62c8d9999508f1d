"""Sample text from a language model that train.py trained (--model gpt, lstm or gru).

    python sample.py --resume RUN/checkpoint.pt --prompt "ROMEO:" --max-new-tokens 300
    python sample.py --resume RUN/checkpoint.pt --impl torch --temperature 0.8 --top-k 20 --seed 1

Prints the prompt and the characters sampled after it by the hand-written model (``--impl torch``: its nn.Module
twin).  Bad input (an image model's checkpoint, a character outside the vocabulary, a damaged file) is one line on
stderr and exit status 2.  The work is training.tasks.sampling.sample_text's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    a = p.add_argument
    a("--resume", type=Path, required=True, metavar="PATH", help="a text run's checkpoint.pt")
    a("--prompt", default="\n", help="the text to continue (default: a newline, as nanoGPT's sample.py)")
    a("--max-new-tokens", type=int, default=300, help="characters to sample")
    a("--temperature", type=float, default=1.0, help="divides the logits: < 1 is more conservative")
    a("--top-k", type=int, default=None, help="sample among the k most likely characters only")
    a("--seed", type=int, default=0, help="seed of the sampling generator")
    a("--impl", choices=("manual", "torch"), default="manual", help="the hand-written model or its nn.Module twin")
    a("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        from training import UsageError
        from training.tasks.sampling import sample_text
    except KeyboardInterrupt:
        return 130
    try:
        text = sample_text(
            args.resume,
            args.prompt,
            args.max_new_tokens,
            args.temperature,
            args.top_k,
            args.seed,
            args.impl,
            args.device,
        )
    except UsageError as e:
        print(f"sample.py: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
