#!/bin/bash
# Multi-node pretraining under SLURM: one task per node, accelerate starts one process per GPU.
#   sbatch --nodes 2 scripts/slurm_pretrain.sh configs/pretrain/YOUR_CONFIG.yaml data.train=[...] output_dir=runs/base
#SBATCH --job-name=vlp-pretrain
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --time=72:00:00
set -euo pipefail
CONFIG=${1:?usage: sbatch --nodes N scripts/slurm_pretrain.sh CONFIG [key=value ...]}
shift
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
MAIN_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
# srun starts this block once per node; SLURM_NODEID is that node's rank.
srun bash -c "accelerate launch --config_file configs/accelerate/multi_node.yaml \
    --num_machines $SLURM_NNODES --num_processes $((SLURM_NNODES * GPUS_PER_NODE)) \
    --machine_rank \$SLURM_NODEID --main_process_ip $MAIN_HOST --main_process_port 29500 \
    -m vlp.cli pretrain --config $CONFIG $*"
