#!/bin/sh
# What the disk delivers at the request sizes and parallelism flashlm uses, measured with fio (Debian's package),
# to compare with `flashlm bench`'s read throughput: 1 MiB requests (naive / hybrid stream whole layers in
# max_request pieces; sequential and random) and 12 KiB requests (one F16 neuron bundle of the standard shape, the sparse mode), 64 in flight
# through io_uring with O_DIRECT, random offsets over the model file.
# usage: bench/fio.sh MODEL.flm [SECONDS]
set -eu
f=${1:?usage: bench/fio.sh MODEL.flm [SECONDS]}
t=${2:-15}
command -v fio >/dev/null || { [ "$(id -u)" -eq 0 ] && apt-get install -y -qq fio >/dev/null || sudo apt-get install -y -qq fio >/dev/null; }
for job in read:1M randread:1M randread:12k; do
    rw=${job%%:*} bs=${job#*:}
    printf '%s %s, 64 in flight, io_uring, O_DIRECT: ' "$rw" "$bs"
    fio --name=flashlm --filename="$f" --readonly --rw="$rw" --bs="$bs" --iodepth=64 --ioengine=io_uring \
        --direct=1 --runtime="$t" --time_based --group_reporting --output-format=terse --terse-version=3 |
        awk -F';' '{ printf "%.2f GB/s, %.0f IOPS, mean latency %.0f us\n", $7 * 1024 / 1e9, $8, $40 }'
done
