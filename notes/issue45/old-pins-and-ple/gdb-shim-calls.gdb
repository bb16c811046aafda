set pagination off
set confirm off
set breakpoint pending on
set follow-fork-mode child
set detach-on-fork on
set logging file /tmp/h6/gdb/log.txt
set logging overwrite on
set logging redirect on
set logging enabled on
set print thread-events off
set print inferior-events off
handle SIGPIPE nostop noprint pass
handle SIGUSR1 nostop noprint pass
handle SIGUSR2 nostop noprint pass
handle SIGCHLD nostop noprint pass
break kvaudit_shim_decode
commands
silent
printf "decode h=%p n=%d pos=%s logits_last=%d toks:", $rdi, $rsi, $rcx ? "given" : "NULL", $r9
set $i = 0
while $i < $rsi && $i < 12
printf " %d", ((int*)$rdx)[$i]
set $i = $i + 1
end
if $rcx
printf " pos0=%d", ((int*)$rcx)[0]
end
printf " seq0=%d\n", $r8 ? ((int*)$r8)[0] : -99
continue
end
break kvaudit_shim_clear
commands
silent
printf "clear h=%p data=%d\n", $rdi, $rsi
continue
end
break kvaudit_shim_open
commands
silent
printf "open\n"
continue
end
break kvaudit_shim_state_set
commands
silent
printf "state_set h=%p len=%d\n", $rdi, $rdx
continue
end
break kvaudit_shim_state_seq_set
commands
silent
printf "state_seq_set h=%p seq=%d\n", $rdi, $rsi
continue
end
break kvaudit_shim_state_seq_set_ext
commands
silent
printf "state_seq_set_ext h=%p seq=%d\n", $rdi, $rsi
continue
end
break kvaudit_shim_seq_rm
commands
silent
printf "seq_rm h=%p seq=%d %d %d\n", $rdi, $rsi, $rdx, $rcx
continue
end
break kvaudit_shim_seq_cp
commands
silent
printf "seq_cp h=%p\n", $rdi
continue
end
break kvaudit_shim_get_logits_ith
commands
silent
printf "get_logits h=%p\n", $rdi
continue
end
run
