// fpcheck's register round trip (see fpcheck.c).
//
// zcheck(seed rdi, sysno rsi, out rdx, spins rcx, page r8): loads a pattern
// derived from seed into zmm0-31 and k1-7; writes a byte to page if it is
// not NULL (a page fault); then makes one system call or spins: sysno 1000
// is getpid and 1024 sched_yield, each as "mov $N, %eax; syscall", the
// form gVisor's systrap patches into a call of its stub's syshandler;
// another sysno >= 0 is made as it is; a negative one spins `spins` times.
// It then stores every register to out (32*64 bytes of zmm, then k1-7 at
// 2048+8*i). Needs AVX-512 F and BW.
	.text
	.globl zcheck
zcheck:
	push %rbx
	mov %rcx, %r9
	mov %r8, %r10
	movabs $0x0123456789abcdef, %r8
	mov %rdi, %rax
	.irp i,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
	vpbroadcastq %rax, %zmm\i
	add %r8, %rax
	.endr
	.irp i,1,2,3,4,5,6,7
	kmovq %rax, %k\i
	add %r8, %rax
	.endr
	test %r10, %r10
	jz 6f
	movb $1, (%r10)
6:	test %rsi, %rsi
	js 2f
	cmp $1000, %rsi
	je 4f
	cmp $1024, %rsi
	je 5f
	mov %rsi, %rax
	syscall
	jmp 3f
4:	mov $39, %eax
	syscall
	jmp 3f
5:	mov $24, %eax
	syscall
	jmp 3f
2:	dec %r9
	jnz 2b
3:
	.irp i,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
	vmovdqu64 %zmm\i, (64*\i)(%rdx)
	.endr
	.irp i,1,2,3,4,5,6,7
	kmovq %k\i, (2048+8*\i)(%rdx)
	.endr
	vzeroupper
	pop %rbx
	ret
	.globl clobber
clobber:
	mov $0x5a5a5a5a5a5a5a5a, %rax
	.irp i,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
	vpbroadcastq %rax, %zmm\i
	.endr
	.irp i,1,2,3,4,5,6,7
	kmovq %rax, %k\i
	.endr
	vzeroupper
	ret
	.section .note.GNU-stack,"",@progbits
