"""A node that takes node 0's seat in etcd and keeps its lease, nothing else (no torch): the
consensus tests kill it or cut it off. argv: ENDPOINTS JOB MEMBER TTL MARGIN [TOKEN] (a token:
the job's own etcd, spoken to as a node of the job does, over TLS and logged in). It prints
`holder M term T` (or `holder M` of whoever holds the seat) and, if its lease is lost,
`fenced <time.monotonic()> <why>`."""

import sys
import tempfile
import time
from pathlib import Path

from entrypoint.consensus.election import Holder, campaign
from entrypoint.consensus.embedded import USER, client_context, job_tls, password
from entrypoint.consensus.etcd import Etcd
from entrypoint.consensus.lease import LeaseKeeper
from entrypoint.plan.values import endpoints_from

endpoint, job, member, ttl, margin = sys.argv[1:6]
etcd = Etcd(endpoints_from(endpoint))
if len(sys.argv) > 6:  # the job's token: the embedded etcd's TLS and auth
    mine = job_tls(Path(tempfile.mkdtemp()) / "tls", sys.argv[6], f"node{member}", ())
    etcd.tls = client_context(mine)
    etcd.login(USER, password(sys.argv[6]))


def fence(why: str) -> None:
    print(f"fenced {time.monotonic()} {why}", flush=True)


keeper = LeaseKeeper.grant(etcd, int(ttl), fence, float(margin))
seat = campaign(etcd, job, Holder(int(member), f"host-{member}", "127.0.0.1:1"), keeper.lease)
print(f"holder {seat.member} term {seat.term}", flush=True)
time.sleep(3600)
