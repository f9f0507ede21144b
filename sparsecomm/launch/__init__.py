"""Start ranks on this machine, optionally over an emulated cluster network.

    python -m sparsecomm.launch --nproc 4 --bandwidth 1gbit -- python train.py --epochs 1
    python -m sparsecomm.launch --nnodes 2 --nproc-per-node 2 --bandwidth 1gbit -- python train.py
    python -m sparsecomm.launch --nproc 2 --bandwidth none -- python train.py
    python -m sparsecomm.launch --nproc 2 --bandwidth 1gbit --backend mpi -- python -m mpi4py prog.py

The cluster has N nodes of L ranks each (``--nnodes N --nproc-per-node L``, L defaults to 1);
``--nproc P`` is P nodes of one rank, and may be given with either of the two others when it
equals their product. With ``--bandwidth RATE`` (e.g. ``1gbit``, ``100mbit``) every node is one
network namespace with one veth link into a bridge namespace (a switch), and both ends of each
link are shaped with ``tc ... tbf rate RATE`` -- a full-duplex switch port of that speed, which
reproduces the papers' 1 Gbit/s Ethernet clusters (``netem`` is not available here; ``tbf``
is). The L ranks of a node share its namespace, its address and so its one link, as the GPUs
of a node share its network card: two ranks of a node sending to other nodes at once get about
half the rate each. Between two ranks of one node, traffic goes to the node's own address,
which the kernel delivers over the namespace's loopback, never through the shaped link
(measured: 100 MB between two ranks of a node in 0.03 s, 27 Gbit/s, with no byte through the
node's shaped ``tc`` queue; 0.96 Gbit/s between nodes over 1gbit). Every node's namespace
names the emulated addresses in a ``hosts`` file of its own and looks names up there only
(``/etc/netns/<namespace>/``, which ``ip netns exec`` mounts over /etc): c10d looks up the
name of every peer it accepts, and the namespaces cannot reach this machine's DNS server
(:meth:`EmulatedNetwork.name_files`). This needs root and
iproute2. ``--bandwidth none`` runs all ranks on plain loopback.

Each rank gets the variables torchrun sets on N nodes (MASTER_ADDR (node 0's address),
MASTER_PORT, RANK = node * L + local rank, WORLD_SIZE = N * L, LOCAL_RANK, LOCAL_WORLD_SIZE =
L, GROUP_RANK = NODE_RANK = node, GROUP_WORLD_SIZE = N, ROLE_RANK, ROLE_WORLD_SIZE) plus
GLOO_SOCKET_IFNAME (the node's link, ``eth<node>``; ``lo`` on loopback), so a script calling
``torch.distributed.init_process_group("gloo")`` works unchanged, and SPARSECOMM_BANDWIDTH
(the link rate, empty on loopback) and SPARSECOMM_NPROC_PER_NODE (L) so it can say what network
it ran on. A bare ``python`` or ``python3`` as the command's first word is the launcher's own
interpreter (``sys.executable``, as torchrun runs a script) when PATH's is another one or none,
said in one line: ``.venv/bin/python -m sparsecomm.launch ... -- python train.py`` runs the ranks
in that venv, activated or not; a path (``/usr/bin/python3``) runs as given. Output lines are
prefixed with the rank. When a rank fails, the others are stopped and the launch exits non-zero.
Every namespace the launch made is removed on exit, also on Ctrl-C or a crash of a rank.

Before the ranks start, the launcher measures the links with one TCP connection, at most
0.3 s: with one rank per node from rank 0's namespace to rank 1's, printing ``link: 1 Gbit/s
configured, 0.958 Gbit/s measured rank 0 -> rank 1``; with several, from node 0 to node 1 and
between two ends inside node 0, printing ``link: 2 nodes x 2 ranks; between nodes 1 Gbit/s
configured, 0.957 Gbit/s measured node 0 -> node 1; inside a node loopback, 13.7 Gbit/s
measured rank 0 -> rank 1``. The ranks get the rate between nodes as
SPARSECOMM_MEASURED_BANDWIDTH and the one inside a node as SPARSECOMM_MEASURED_INTRA_BANDWIDTH
(bits/s, empty when not measured: one node, one rank per node for the latter, or ``--bandwidth
none``), and :func:`describe_link` names them.

If the launcher itself is killed outright (SIGKILL, the OOM killer), every process it started
(the ranks, ``ip netns exec``, mpirun and through it the mpi ranks) gets SIGKILL from the
kernel (PR_SET_PDEATHSIG), so no rank runs on. Its namespaces cannot be removed then; the next
launch removes them (``sc<pid>r<rank>``, ``sc<pid>n<node>`` and ``sc<pid>br`` namespaces and
the ``sc<pid>h`` link of the mpi backend whose launcher pid no longer runs, killing anything
still inside) and leaves those of live launches alone.

``--backend gloo`` (the default) starts the ranks itself. ``--backend mpi`` starts them with
one Open MPI ``mpirun`` (tested with 4.1), so mpi4py programs (``sparsecomm.comm.MPIComm``) run
too, and gloo programs still get the variables above. MPI's traffic (``--mca btl self,tcp``)
goes over the shaped links between nodes and over loopback inside a node; mpirun's PMIx server
is reached through one extra, unshaped veth from the root namespace into the bridge, which only
the mpi backend creates and which is removed with the namespaces. Each rank starts through this
module (``--mpi-rank``, internal), which sets the rank's variables from
``OMPI_COMM_WORLD_RANK``/``_SIZE`` and execs the command inside the namespace of the rank's
node. mpirun's tagged output is turned into the same ``[rank N]`` lines (its own messages get
``[mpirun]``). mpirun stops the other ranks when one exits non-zero. Note that an mpi4py
program which exits non-zero after MPI was initialized first waits in ``MPI_Finalize`` for the
other ranks; run it as ``python -m mpi4py prog.py`` so that an exit or an uncaught exception
aborts the whole job at once. With ``--bandwidth none`` mpirun runs on loopback (TCP over
``lo``).
"""

# _format_bits, _rate_bits and _MPIOutput are private: they are imported here because the tests read them here
from .cli import main
from .link import _format_bits, _rate_bits, describe_link, parse_rate  # noqa: F401
from .mpi import _MPIOutput, find_mpirun  # noqa: F401
from .network import EmulatedNetwork, LaunchError, NetworkSetupError, measure_rate, remove_stale_namespaces
from .supervision import launch

__all__ = ["EmulatedNetwork", "launch", "main", "parse_rate", "find_mpirun", "describe_link", "LaunchError",
           "NetworkSetupError", "measure_rate", "remove_stale_namespaces"]
