# Sourced by bench/tune.sh and bench/keep-gathered.sh: the emulated cluster both run on and the model
# both price and train. Sets `launch` (scripts/cluster: 2 hosts x 2 ranks, 1 Gbit/s between the hosts,
# loopback inside; `dhelix tune --launch`) and `model` (tune's flags: GPT-2's width, 2 layers, a
# 2,048-token vocabulary, T = 128, 8 sequences a step, micro-batch 1, 4 ranks on cpu-emulated with
# the GEMMs timed here).
launch="scripts/cluster --hosts 2 --rate 1gbit --np-per-host 2 --map-by slot --cpus ${DHELIX_CLUSTER_CPUS:-auto} \
--mpirun-arg --mca --mpirun-arg mpi_yield_when_idle --mpirun-arg 1 --"
model=(--model gpt2-124m --d-model 768 --layers 2 --heads 12 --vocab 2048 --seq 128 --global-batch 8
       --micro-batch-size 1 --gpus 4 --cluster configs/clusters/cpu-emulated.toml --measure-gemm)

# cluster4_setup NAME ARGS...: --rounds R and --steps S into `rounds` and `steps` (their defaults set
# by the caller), anything else refused (exit 2); builds dhelix into $DHELIX_BUILD (default build)
# and sets `bin` to it; makes the work directory `work` (removed on exit).
cluster4_setup() {
  local name=$1; shift
  while [ $# -gt 0 ]; do
    case "$1" in
      --rounds) rounds=$2; shift 2 ;;
      --steps) steps=$2; shift 2 ;;
      *) echo "bench/$name.sh: unknown argument '$1' (use --rounds R --steps S)" >&2; exit 2 ;;
    esac
  done
  local build=${DHELIX_BUILD:-build}
  cmake --build "$build" --target dhelix >/dev/null
  bin="$PWD/$build/dhelix"
  work=$(mktemp -d "/tmp/dhelix_bench_$name.XXXXXX")
  trap 'rm -rf "$work"' EXIT
}
