// benchmarks/bench_pipeline.cpp: being written.
int main() { return 0; }
