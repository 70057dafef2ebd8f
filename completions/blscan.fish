# fish completion for blscan
complete -c blscan -f
complete -c blscan -s a -l adapter -x -a '(ls /sys/class/bluetooth 2>/dev/null | string match -v "*:*")' -d 'Adapter to scan with'
complete -c blscan -s s -l service -x -d 'Only devices advertising this service UUID'
complete -c blscan -l name -x -d 'Only devices with this name'
complete -c blscan -l rssi-min -x -d 'Only devices heard at least this strongly (dBm)'
complete -c blscan -s t -l timeout -x -d 'Seconds to scan'
complete -c blscan -s j -l json -d 'One JSON object per line'
complete -c blscan -s 1 -l first -d 'Print the first match and exit'
complete -c blscan -s h -l help -d 'Show help and exit'
complete -c blscan -l version -d 'Show the version and exit'
