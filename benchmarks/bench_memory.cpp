// benchmarks/bench_memory.cpp: being written.
int main() { return 0; }
