"""`python -m entrypoint.job`: the built-in DeepSpeed job (torchrun starts one per worker)."""

from entrypoint.job.deepspeed_train import main

raise SystemExit(main())
