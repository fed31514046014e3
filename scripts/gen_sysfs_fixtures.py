#!/usr/bin/env python3
"""Write the sysfs fixture trees the kubelet-config tests read (agent/tests/fixtures/sysfs/).

Each host is described by its shape (AWS's published vCPU, NUMA, GPU and EFA counts, with
Linux's usual CPU numbering: the first thread of every core, then the second threads), and
the script writes only the sysfs files gpu-agent reads. Re-run after changing a shape.
"""
import pathlib
import shutil

ROOT = pathlib.Path(__file__).resolve().parent.parent / "agent" / "tests" / "fixtures" / "sysfs"


def cpulist(cpus):
    cpus = sorted(cpus)
    out, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def host(name, product, cores, numa, smt, mem_gib, gpus, efas, numa_known=True,
         gpu_device="0x2330", efa_device="0xefa1", gpu_numa_nodes=0, gpu_mem_gib=0):
    """gpu_numa_nodes: CPU-less NUMA nodes per GPU after the CPU nodes (Grace with coherent
    driver memory mode off: the first holds the GPU's memory, gpu_mem_gib, the rest none)."""
    root = ROOT / name
    shutil.rmtree(root, ignore_errors=True)
    threads = 2 if smt else 1
    ncpu = cores * threads
    write(root / "devices/system/cpu/online", cpulist(range(ncpu)))
    per_node = cores // numa
    for n in range(numa):
        node_cores = range(n * per_node, (n + 1) * per_node)
        cpus = list(node_cores) + ([c + cores for c in node_cores] if smt else [])
        write(root / f"devices/system/node/node{n}/cpulist", cpulist(cpus))
        kb = mem_gib * 1024 * 1024 // numa
        write(root / f"devices/system/node/node{n}/meminfo", f"Node {n} MemTotal:       {kb} kB\nNode {n} MemFree:        {kb - 1024} kB")
    for g in range(gpus):
        for k in range(gpu_numa_nodes):
            n = numa + g * gpu_numa_nodes + k
            kb = gpu_mem_gib * 1024 * 1024 if k == 0 else 0
            write(root / f"devices/system/node/node{n}/cpulist", "")
            write(root / f"devices/system/node/node{n}/meminfo", f"Node {n} MemTotal:       {kb} kB\nNode {n} MemFree:        {kb} kB")
    for c in range(cores):
        sib = [c, c + cores] if smt else [c]
        for cpu in sib:
            write(root / f"devices/system/cpu/cpu{cpu}/topology/thread_siblings_list", cpulist(sib))
    if product:
        write(root / "class/dmi/id/product_name", product)
    def dev(bus, vendor, device, klass, node):
        d = root / f"bus/pci/devices/0000:{bus:02x}:00.0"
        write(d / "vendor", vendor)
        write(d / "device", device)
        write(d / "class", klass)
        write(d / "numa_node", str(node if numa_known else -1))
    for g in range(gpus):
        dev(0x80 + g, "0x10de", gpu_device, "0x030200", g * numa // gpus)
    for e in range(efas):
        dev(0x10 + e, "0x1d0f", efa_device, "0x020000", e * numa // efas)


host("p5.48xlarge", "p5.48xlarge", cores=96, numa=2, smt=True, mem_gib=2048, gpus=8, efas=32)
host("p4d.24xlarge", "p4d.24xlarge", cores=48, numa=2, smt=True, mem_gib=1152, gpus=8, efas=4)
host("g5.xlarge", "g5.xlarge", cores=2, numa=1, smt=True, mem_gib=16, gpus=1, efas=0)
host("numa-unknown", None, cores=24, numa=2, smt=True, mem_gib=192, gpus=4, efas=0, numa_known=False)
host("smt-off", "p4d.24xlarge", cores=48, numa=2, smt=False, mem_gib=1152, gpus=8, efas=4)
# Grace-Blackwell: two Grace CPUs (72 Neoverse V2 cores each, no SMT), two B200 per Grace,
# four EFA devices. Coherent driver memory mode on (the EKS AMI's default), then off: each
# GPU's memory a CPU-less NUMA node plus 7 memoryless ones (34 NUMA nodes in all).
host("p6e-gb200.36xlarge", "p6e-gb200.36xlarge", cores=144, numa=2, smt=False, mem_gib=960,
     gpus=4, efas=4, gpu_device="0x2941", efa_device="0xefa3")
host("p6e-gb200.36xlarge-gpu-numa", "p6e-gb200.36xlarge", cores=144, numa=2, smt=False,
     mem_gib=960, gpus=4, efas=4, gpu_device="0x2941", efa_device="0xefa3", gpu_numa_nodes=8,
     gpu_mem_gib=184)
