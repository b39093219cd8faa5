"""Starting GPU workers: LocalCUDACluster, CUDAWorker and the HPC, MPI and Kubernetes launchers."""
