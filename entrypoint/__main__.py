"""`python -m entrypoint` and the `entrypoint` command. From the first line on, SIGINT, SIGTERM
and SIGHUP end a command quietly with 128 + N, however early they come (a command that has
its own handlers, `run` and `local`, takes over from there): the handlers are set before
anything is imported. SIGINT is taken even where the parent ignored it (a shell's background
job): a person's Ctrl-C is never lost. An ignored SIGHUP (nohup) stays ignored."""

import signal


def _stop(number: int, _frame: object) -> None:
    raise KeyboardInterrupt(number)


for _number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    if _number != signal.SIGHUP or signal.getsignal(_number) is not signal.SIG_IGN:
        signal.signal(_number, _stop)


def main() -> int:
    try:
        from entrypoint.cli import main as cli

        return cli()
    except KeyboardInterrupt as interrupt:
        from entrypoint.plan.errors import interrupted_exit

        return interrupted_exit(interrupt)


if __name__ == "__main__":
    raise SystemExit(main())
