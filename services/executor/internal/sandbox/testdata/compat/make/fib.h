unsigned long long fib(int n);
