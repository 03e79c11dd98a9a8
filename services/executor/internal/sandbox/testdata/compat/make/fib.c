#include "fib.h"

unsigned long long fib(int n)
{
	unsigned long long a = 0, b = 1;
	while (n-- > 0) {
		unsigned long long t = a + b;
		a = b;
		b = t;
	}
	return a;
}
