#!/usr/bin/env bash
# one-off (not committed): ncu of gla's plain forward kernels at T = 32768, H = 16
tar xzf .gpu.tgz; export LD_LIBRARY_PATH=$PWD/.gpu/lib:${LD_LIBRARY_PATH:-}
P=$OUT/prof; mkdir -p $P
for k in chunk_kkt_kernel gla_output_kernel gla_chain_kernel; do
  timeout 150 ncu --set full -k regex:$k --launch-count 1 -o $P/$k .gpu/kcp bench --backend cuda-chunkwise --variant gla --H 16 --T 32768 --backward 0 --check 0 --warmup 0 --repeat 1 > $P/$k.run.log 2>&1
  ncu -i $P/$k.ncu-rep > $P/$k.details.txt 2>&1
  ncu -i $P/$k.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $P/$k.sass.csv.gz; rm -f $P/$k.ncu-rep
  grep -E "^    (Duration|DRAM Throughput|Memory Throughput|L2 Cache Throughput|Registers Per|Achieved Occupancy|Executed Ipc A|Issue Slots Busy)" $P/$k.details.txt | sed "s/^/$k /"
done
tar czf $OUT/prof.tgz -C $OUT prof && rm -rf $P
